# Run by sandboxd image build (pycompile.go) with the host's interpreter:
# compiles every SRC/x.py to OUT/<its __pycache__ path>, naming the image
# path /x.py in tracebacks. Sources that do not compile (test data written
# for Python 2) are skipped, as Debian's py3compile does.
import importlib.util
import os
import py_compile
import sys

src, out = sys.argv[1], sys.argv[2]
for dirpath, dirnames, filenames in os.walk(src):
    dirnames.sort()
    for f in sorted(filenames):
        if not f.endswith(".py"):
            continue
        image_path = "/" + os.path.relpath(os.path.join(dirpath, f), src)
        cfile = out + importlib.util.cache_from_source(image_path)
        try:
            py_compile.compile(os.path.join(dirpath, f), cfile=cfile, dfile=image_path, doraise=True,
                               invalidation_mode=py_compile.PycInvalidationMode.UNCHECKED_HASH)
        except (py_compile.PyCompileError, SyntaxError, ValueError):
            pass
