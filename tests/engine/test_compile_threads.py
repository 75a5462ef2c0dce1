"""`shutdown_compile_threads`: no thread of Inductor's compile pool is left running after it
(#35: `ardiff bench` ended warning about two ThreadPoolExecutor threads)."""

from __future__ import annotations

import threading

from ardiff.engine.build import shutdown_compile_threads


def compile_pool_threads() -> list[str]:
    return [t.name for t in threading.enumerate()
            if not t.daemon and t.name.startswith("ThreadPoolExecutor")]


def test_the_compile_pool_threads_end(monkeypatch):
    from torch._inductor import async_compile

    monkeypatch.setattr(async_compile, "get_compile_threads", lambda: 2)
    async_compile.AsyncCompile.pool.cache_clear()
    pool = async_compile.AsyncCompile.pool()  # what a compile of many kernels starts
    list(pool.map(lambda x: x, range(4)))
    assert compile_pool_threads()
    shutdown_compile_threads()
    assert compile_pool_threads() == []
    assert async_compile.AsyncCompile.pool() is not pool  # a later compile gets a fresh one
    shutdown_compile_threads()


def test_nothing_compiled_is_nothing_to_end():
    shutdown_compile_threads()
