from verl_cluster.cli import main

raise SystemExit(main())
