"""A process that imports `stages` keeps a malloc arena per thread past glibc's default limit (8 per core): torch's
worker thread must not share an arena with the thread it works beside once Prefect's and the JVM's threads exist."""

import os
import subprocess
import sys
import textwrap

import pytest

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's malloc arenas")
GLIBC_DEFAULT = 8 * len(os.sched_getaffinity(0)) if sys.platform.startswith("linux") else 0  # arenas: 8 per core

# Starts threads that each allocate and stay alive, then counts the arenas glibc reports (`malloc_info`'s heaps).
COUNT_ARENAS = textwrap.dedent("""
    import ctypes, re, sys, threading
    import stages
    threads, started, done = int(sys.argv[1]), threading.Barrier(int(sys.argv[1]) + 1), threading.Event()
    def hold():
        kept = [bytearray(4096) for _ in range(4)]  # past Python's small-object allocator: malloc's own
        started.wait()
        done.wait()
    workers = [threading.Thread(target=hold) for _ in range(threads)]
    for worker in workers:
        worker.start()
    started.wait()
    libc = ctypes.CDLL(None)
    libc.open_memstream.restype = ctypes.c_void_p
    libc.open_memstream.argtypes = [ctypes.POINTER(ctypes.c_char_p), ctypes.POINTER(ctypes.c_size_t)]
    libc.malloc_info.argtypes = [ctypes.c_int, ctypes.c_void_p]
    libc.fclose.argtypes = [ctypes.c_void_p]
    text, size = ctypes.c_char_p(), ctypes.c_size_t()
    stream = libc.open_memstream(ctypes.byref(text), ctypes.byref(size))
    libc.malloc_info(0, stream)
    libc.fclose(stream)
    print(len(re.findall(rb"<heap nr=", text.value)))
    done.set()
""")


def arenas_with_threads(threads: int, **env: str) -> int:
    out = subprocess.run([sys.executable, "-c", COUNT_ARENAS, str(threads)], capture_output=True, text=True,
                         check=True, env={**os.environ, **env}, timeout=60)
    return int(out.stdout.strip())


def test_threads_past_glibcs_default_each_get_an_arena():
    assert arenas_with_threads(GLIBC_DEFAULT + 16) > GLIBC_DEFAULT + 8


def test_a_limit_the_user_set_is_kept():
    # The same threads under the default limit, set by the user: shared arenas, which the first test would catch.
    assert arenas_with_threads(GLIBC_DEFAULT + 16, MALLOC_ARENA_MAX=str(GLIBC_DEFAULT)) <= GLIBC_DEFAULT
