from jobcontrol.cli.main import main

raise SystemExit(main())
