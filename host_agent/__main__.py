from host_agent.cli import main

raise SystemExit(main())
