import sys
from byteps.server import main
sys.exit(main())
