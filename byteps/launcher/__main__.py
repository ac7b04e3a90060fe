import sys
from byteps.launcher import main
sys.exit(main())
