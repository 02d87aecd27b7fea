"""python -m shadowlab.matrix docs/matrix.md: regenerate the reference section from the schema."""

import sys

from shadowlab.matrix.docs import write_reference

write_reference(sys.argv[1] if len(sys.argv) > 1 else "docs/matrix.md")
