import signal

from rlcluster_lab.cli.main import main

code = main()
# The command is over: a Ctrl-C during JAX's exit handlers would only print a traceback from inside them.
signal.signal(signal.SIGINT, signal.SIG_IGN)
raise SystemExit(code)
