from rlcluster_lab.cli import main

raise SystemExit(main())
