from jobcontrol.cli import main

raise SystemExit(main())
