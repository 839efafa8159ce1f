"""Threads and processes: the GIL is released while a call waits; threads
share one client correctly; a forked child gets ps.ForkError and the
parent's client keeps working."""
import os
import threading
import time

import numpy as np

import ps


def test_gil_released_while_pull_waits(cluster):
    cl = cluster(workers=2, tensors={"c": 5})
    with ps.Client(cl.path, 0) as c0, ps.Client(cl.path, 1) as c1:
        c0.push({"c": np.ones(5, np.float32)})        # rank 0 ends clock 0
        w = np.zeros(5, np.float32)
        result = {}

        def pull():  # waits until rank 1 ends clock 0 too
            result["version"] = c0.pull({"c": w}, min_version=1)

        t = threading.Thread(target=pull)
        t.start()
        # this thread keeps running Python while the other waits in pull()
        spins, t0 = 0, time.monotonic()
        while time.monotonic() - t0 < 0.3:
            spins += 1
        assert t.is_alive() and "version" not in result, "pull returned before rank 1 pushed"
        assert spins > 10000, f"only {spins} iterations: the GIL was held"
        c1.push({"c": np.full(5, 2, np.float32)})
        t.join(timeout=10)
        assert not t.is_alive()
        assert result["version"] == 1
        np.testing.assert_array_equal(w, np.full(5, -3, np.float32))


def test_threads_share_one_client(cluster):
    tensors = {f"t{i}": 1000 + i for i in range(4)}
    cl = cluster(workers=1, mode="async", tensors=tensors)
    n = 50
    with ps.Client(cl.path, 0) as c:
        errors = []

        def work(i):
            try:
                name = f"t{i}"
                g = {name: np.full(tensors[name], i + 1, np.float32)}
                w = {name: np.zeros(tensors[name], np.float32)}
                for k in range(n):
                    if k % 2:
                        c.push_async(g, end_clock=False).wait(timeout=30)
                    else:
                        c.push(g, end_clock=False)
                    c.pull(w)
                    # each of this thread's pushes is applied before its pull is answered
                    assert w[name][0] <= -(k + 1) * (i + 1), (name, k, w[name][0])
            except Exception as e:  # reported by the main thread
                errors.append(e)

        threads = [threading.Thread(target=work, args=(i,)) for i in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=60)
        assert not errors, errors
        for i, (name, k) in enumerate(tensors.items()):
            w = {name: np.zeros(k, np.float32)}
            c.pull(w)
            np.testing.assert_array_equal(w[name], np.full(k, -n * (i + 1), np.float32))


def test_fork(cluster):
    cl = cluster(workers=1, tensors={"c": 5})
    with ps.Client(cl.path, 0) as c:
        c.push({"c": np.ones(5, np.float32)})
        h = c.pull_async({"c": np.zeros(5, np.float32)})
        r, wfd = os.pipe()
        pid = os.fork()
        if pid == 0:  # the child: every use of the parent's client is refused
            os.close(r)
            out = []
            for call in (lambda: c.push({"c": np.ones(5, np.float32)}),
                         lambda: c.pull({"c": np.zeros(5, np.float32)}),
                         lambda: c.stats(0), lambda: h.wait()):
                try:
                    call()
                    out.append("no error")
                except ps.ForkError as e:
                    out.append("ForkError " + str(e))
                except BaseException as e:
                    out.append(f"{type(e).__name__} {e}")
            os.write(wfd, "\n".join(out).encode())
            os._exit(0)
        os.close(wfd)
        with os.fdopen(r) as f:
            lines = f.read().splitlines()
        _, status = os.waitpid(pid, 0)
        assert status == 0
        assert len(lines) == 4, lines
        for line in lines:
            assert line.startswith("ForkError PS_ESTATE:") and "fork" in line, line
        assert "spawn" in lines[0]
        # the parent's client and handle still work
        assert h.wait(timeout=10) == 1
        w = np.zeros(5, np.float32)
        c.push({"c": np.ones(5, np.float32)})
        assert c.pull({"c": w}) == 2
        np.testing.assert_array_equal(w, np.full(5, -2, np.float32))


def test_handle_timeout_and_done(cluster):
    cl = cluster(workers=2, tensors={"c": 5})
    with ps.Client(cl.path, 0) as c0, ps.Client(cl.path, 1) as c1:
        c0.push({"c": np.ones(5, np.float32)})
        w = np.zeros(5, np.float32)
        h = c0.pull_async({"c": w}, min_version=1)     # waits for rank 1
        assert not h.done()
        t0 = time.monotonic()
        try:
            h.wait(timeout=0.2)
            raise AssertionError("wait returned before rank 1 pushed")
        except ps.TimeoutError as e:
            assert isinstance(e, TimeoutError) and "wait again" in str(e)
        assert 0.15 < time.monotonic() - t0 < 5
        c1.push({"c": np.ones(5, np.float32)})
        assert h.wait(timeout=10) == 1
        assert h.done() and h.wait() == 1             # a finished handle answers again
        np.testing.assert_array_equal(w, np.full(5, -2, np.float32))


def test_close_with_a_call_in_flight(cluster):
    """close() refuses new calls at once; a handle in flight still completes
    (the client is freed after it)."""
    cl = cluster(workers=2, tensors={"c": 5})
    c0, c1 = ps.Client(cl.path, 0), ps.Client(cl.path, 1)
    c0.push({"c": np.ones(5, np.float32)})
    w = np.zeros(5, np.float32)
    g = np.full(5, 7, np.float32)
    h = c0.pushpull_async({"c": g}, {"c": w}, clock=1, min_version=1)
    c0.close()
    assert c0.closed
    try:
        c0.pull({"c": w})
        raise AssertionError("a closed client answered")
    except ps.StateError as e:
        assert "closed" in str(e)
    c1.push({"c": np.ones(5, np.float32)})
    assert h.wait(timeout=10) >= 1
    np.testing.assert_array_equal(w[:1], [-2])
    c1.close()


def test_async_arrays_kept_alive(cluster):
    """A handle holds the arrays of its call until it completes; a handle
    dropped without wait() waits in its destructor."""
    import sys
    cl = cluster(workers=2, tensors={"c": 5})
    with ps.Client(cl.path, 0) as c0, ps.Client(cl.path, 1) as c1:
        c0.push({"c": np.ones(5, np.float32)})
        w = np.zeros(5, np.float32)
        before = sys.getrefcount(w)
        h = c0.pull_async({"c": w}, min_version=1)      # pending until rank 1 pushes
        assert sys.getrefcount(w) > before, "the handle does not hold the array"
        c1.push({"c": np.ones(5, np.float32)})
        assert h.wait(timeout=10) == 1
        assert sys.getrefcount(w) == before, "the array is still held after completion"
        g = np.full(5, 3, np.float32)
        h = c0.push_async({"c": g})
        del h, g                                           # waits; nothing leaks or breaks
        assert c0.clock() == 2
        c1.push({"c": np.zeros(5, np.float32)})
        out = np.zeros(5, np.float32)
        assert c0.pull({"c": out}) == 2
        np.testing.assert_array_equal(out, np.full(5, -5, np.float32))
