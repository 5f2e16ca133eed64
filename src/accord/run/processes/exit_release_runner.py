"""Run the script named by sys.argv[1] as `python script.py` would, releasing its globals at exit.

The launcher passes this file's text with -c (see exit_release.py beside it): a worker's host
may have no copy of this package, so the code travels on the command line. Standard library
only, compatible with Python 3.8, and never imported: it runs only as -c's __main__.
"""


def _run_script():
    import atexit
    import builtins
    import gc
    import importlib.machinery
    import os
    import runpy
    import sys
    import types

    path = sys.argv[1]
    del sys.argv[0]
    if not os.path.isfile(path) or path.endswith(('.pyc', '.pyo')):
        runpy.run_path(path, run_name='__main__')
        return
    if sys.path and sys.path[0] == '':
        sys.path[0] = os.path.dirname(os.path.realpath(path))
    main = types.ModuleType('__main__')
    main.__file__ = os.path.abspath(path)
    main.__cached__ = None
    main.__loader__ = importlib.machinery.SourceFileLoader('__main__', main.__file__)
    main.__builtins__ = builtins
    sys.modules['__main__'] = main

    def release():
        names = main.__dict__
        kept = (types.ModuleType, type, types.FunctionType, types.BuiltinFunctionType)
        for name in reversed(list(names)):
            value = names[name]
            if (name.startswith('__') and name.endswith('__')) or isinstance(value, kept):
                continue
            # held elsewhere too, maybe by a cycle; an object the collector does not track (an
            # int, a string, a tuple or dict of such) is in no cycle, however many hold it (small
            # ints and interned strings are held everywhere), and a full collection costs
            # ~0.1 s once torch is loaded
            shared = gc.is_tracked(value) and sys.getrefcount(value) > 3
            names[name] = value = None
            if shared:
                gc.collect()  # a cycle goes now, while what it may use is still defined

    atexit.register(release)
    failed = None
    try:
        with open(main.__file__, 'rb') as source:
            code = compile(source.read(), main.__file__, 'exec')
        exec(code, main.__dict__)
    except (SystemExit, KeyboardInterrupt):
        raise
    except BaseException:
        kind, value, trace = sys.exc_info()
        trace = trace.tb_next  # from the script's first frame on, as Python shows it
        sys.excepthook(kind, value.with_traceback(trace), trace)
        failed = True
        del kind, value, trace  # the frames (and what their locals hold) go now
    if failed:
        sys.exit(1)


if __name__ == '__main__':
    _run_script()
