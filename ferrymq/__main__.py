from ferrymq.cli import main

raise SystemExit(main())
