from swapgate.cli import main

raise SystemExit(main())
