"""tests/run: delivery_doubles.py (same folder) is imported by name."""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
