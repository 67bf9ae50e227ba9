from rlcluster_lab.cli.main import main

raise SystemExit(main())
