import pathlib
import sys

# The tensor look-alikes live next to the tests.
sys.path.insert(0, str(pathlib.Path(__file__).parent))
