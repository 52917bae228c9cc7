from swapgate.tools.cli import main

raise SystemExit(main())
