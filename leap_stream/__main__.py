from leap_stream.cli import main

raise SystemExit(main())
