import sys

from jobcontrol_admin.app import main

sys.exit(main())
