"""`python -m spockwire`: the spockwire command line."""
import sys

from .cli import main

sys.exit(main())
