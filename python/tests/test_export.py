"""ps-export and ps.load_export: checkpoints of real shards, read offline,
equal bit for bit to what the shards served; a --since export holds exactly
the rows changed after that incremental checkpoint; damaged files are
refused naming the file and the offset."""
import os
import re
import signal
import socket
import struct
import subprocess
import time
import zlib

import numpy as np
import pytest

import ps
from conftest import ROOT, SERVER

EXPORT = os.path.join(ROOT, "bin", "ps-export")


def export(cfg, out, *args, check=True):
    r = subprocess.run([EXPORT, "--config", cfg, "--out", str(out), *args],
                       capture_output=True, text=True, timeout=120)
    if check:
        assert r.returncode == 0, r.stderr
    return r


def train_rows(c, rng, names, tensors, ids_by_table, dims):
    """One clock: random row gradients for each table's ids, then a dense push."""
    for t, ids in ids_by_table.items():
        ids = np.ascontiguousarray(ids)
        c.push_rows(t, ids, rng.standard_normal((len(ids), dims[t])).astype(np.float32))
    c.push({n: rng.standard_normal(tensors[n]).astype(np.float32) for n in names})


@pytest.fixture
def trained(cluster, tmp_path):
    ck = tmp_path / "ck"
    ck.mkdir()
    dims = {"e": 4, "f": 3}
    cl = cluster(shards=2, workers=1, tables=dims,
                 extra=["checkpoint:", f"  dir: {ck}", "  on_request: true",
                        "  min_interval_s: 0", "  incremental: 5"])
    rng = np.random.default_rng(5)
    names = list(cl.tensors)
    e_ids = np.unique(rng.integers(0, 2**64, 300, dtype=np.uint64))
    f_ids = np.arange(1, 90, dtype=np.uint64) * 1000003
    with ps.Client(cl.path, 0) as c:
        train_rows(c, rng, names, cl.tensors, {"e": e_ids, "f": f_ids}, dims)
        assert all(r["checkpoint_status"] == 0 for r in c.checkpoint())      # full
        train_rows(c, rng, names, cl.tensors, {"e": e_ids[:50]}, dims)
        assert all(r["checkpoint_status"] == 0 for r in c.checkpoint())      # delta-1
        new_e = np.array([5, 2**63 + 11], np.uint64)
        changed = {"e": np.union1d(e_ids[40:60], new_e), "f": f_ids[::7]}
        train_rows(c, rng, names, cl.tensors, {"e": np.concatenate([e_ids[40:60], new_e]),
                                               "f": f_ids[::7]}, dims)
        assert all(r["checkpoint_status"] == 0 for r in c.checkpoint())      # delta-2
        dense = {n: np.zeros(k, np.float32) for n, k in cl.tensors.items()}
        c.pull(dense)
        all_ids = {"e": np.union1d(e_ids, new_e), "f": f_ids}
        rows = {t: c.pull_rows(t, ids) for t, ids in all_ids.items()}
    # SIGKILL: at SIGTERM a shard writes a full checkpoint, which retires the deltas
    assert [cl.stop(k, signal.SIGKILL) for k in range(2)] == [-signal.SIGKILL] * 2
    return cl, dense, all_ids, rows, changed, ck


def test_export_round_trip(trained, tmp_path):
    cl, dense, all_ids, rows, _, ck = trained
    assert os.path.exists(ck / "shard-0.ckpt.delta-2")
    out = tmp_path / "model.npz"
    export(cl.path, out)
    exp = ps.load_export(out)
    assert sorted(exp.dense) == sorted(dense)
    for n, v in dense.items():
        assert exp.dense[n].dtype == np.float32 and exp.dense[n].shape == v.shape
        assert exp.dense[n].tobytes() == v.tobytes(), n
    for t, ids in all_ids.items():
        tb = exp.tables[t]
        np.testing.assert_array_equal(tb.ids, np.sort(ids))
        assert tb.rows.tobytes() == rows[t].tobytes(), t   # all_ids are sorted already
    assert exp.meta["format"] == "ps-export" and exp.meta["since"] is None
    # the shard map's hash as the shards wrote it in their headers (offset 16),
    # and the agreed settings' FNV-1a hash as 16 hex digits
    for k in range(2):
        hdr = struct.unpack_from("<Q", (ck / f"shard-{k}.ckpt").read_bytes(), 16)[0]
        assert exp.meta["map_hash"] == "%016x" % hdr, (exp.meta["map_hash"], hdr)
    assert re.fullmatch("[0-9a-f]{16}", exp.meta["config_hash"]), exp.meta["config_hash"]
    # every other field of the manifest against what made the files: the run
    # (one worker, 3 clocks, sync sgd), the files themselves (the full file's
    # version digit, CRC-32 in its last 4 bytes, length) and the config
    m = exp.meta
    assert (m["format_version"], m["config"], m["optimizer"], m["consistency"]) == \
        (1, cl.path, "sgd", "sync")
    for k, sh in enumerate(m["shards"]):
        full = (ck / f"shard-{k}.ckpt").read_bytes()
        assert sh == {"shard": k, "file": str(ck / f"shard-{k}.ckpt"),
                      "checkpoint_version": full[7] - ord("0"), "map_epoch": 0, "deltas": 2,
                      "base_crc": full[-4:][::-1].hex(), "base_len": len(full),
                      "slice_versions": [3, 3], "finished_clocks": [3],
                      "table_versions": {"e": 3, "f": 3}}, sh
    assert m["dense"] == {n: {"dtype": "float32", "shape": [k], "optimizer": "sgd"}
                          for n, k in cl.tensors.items()}, m["dense"]
    assert m["tables"] == {t: {"dim": d, "rows": len(all_ids[t]), "dtype": "float32",
                               "id_dtype": "uint64", "optimizer": "sgd", "declared": False}
                           for t, d in (("e", 4), ("f", 3))}, m["tables"]
    assert [s["deltas"] for s in exp.meta["shards"]] == [2, 2]
    assert exp.meta["tables"]["e"]["rows"] == len(all_ids["e"])
    # plain numpy reads it too: no project code needed
    with np.load(out) as z:
        assert z["tables/f/ids"].dtype == np.uint64
        assert z["tables/f/rows"].shape == (len(all_ids["f"]), 3)
    # the lookup: exported ids to their rows, others to the zero row
    lk = ps.export_lookup(out, "e")
    q = np.array([all_ids["e"][3], 12345, all_ids["e"][0]], np.uint64)
    got = lk.lookup(q)
    assert got[0].tobytes() == rows["e"][3].tobytes() and not got[1].any()
    assert lk.index(q.view(np.int64))[1] == len(all_ids["e"])
    # the same bytes twice (no time stamps)
    out2 = tmp_path / "again.npz"
    export(cl.path, out2, "--quiet")
    assert out.read_bytes() == out2.read_bytes()


def test_export_row_of_another_shard(trained, tmp_path):
    """A full checkpoint holding a row whose id lives on another shard, its CRC made
    right (a random flip would be caught by the CRC): ps-export refuses it naming the
    offset, the row, the table and the id. (The incremental files are taken away: they
    build on the full file as it was.)"""
    cl, _, _, _, _, ck = trained
    for d in ck.glob("shard-*.ckpt.delta-*"):
        d.unlink()
    f0, f1 = ck / "shard-0.ckpt", ck / "shard-1.ckpt"
    a, b = f0.read_bytes(), f1.read_bytes()
    rb = 16 + 4 * 3                       # table f: dim 3, sgd (struct ckpt_row, floats)

    def last_table(data):
        """The start and rows of the file's last table record (f's, 112 bytes, then rows)."""
        for n in range(100000):
            start = len(data) - 4 - (112 + n * rb)
            assert start > 48
            if (struct.unpack_from("<I", data, start + 8)[0] == 3
                    and struct.unpack_from("<Q", data, start + 24)[0] == n):
                return start, n

    s0, n0 = last_table(a)
    s1, n1 = last_table(b)
    assert n0 > 0 and n1 > 0
    other = struct.unpack_from("<Q", b, s1 + 112)[0]          # a row of shard 1's
    bad = bytearray(a[:-4])
    bad[s0 + 112:s0 + 120] = struct.pack("<Q", other)
    f0.write_bytes(bytes(bad) + struct.pack("<I", zlib.crc32(bytes(bad))))
    r = export(cl.path, tmp_path / "x.npz", check=False)
    assert r.returncode == 1, r.stderr
    assert (f"{f0}: at offset {s0 + 112}: row 0 of table 'f' has id {other}, which lives on "
            "another shard (damaged?)") in r.stderr, r.stderr
    assert not os.path.exists(tmp_path / "x.npz")


def test_export_since_holds_exactly_the_changed_rows(trained, tmp_path):
    cl, _, all_ids, rows, changed, _ = trained
    out = tmp_path / "delta.npz"
    export(cl.path, out, "--since", "1")
    exp = ps.load_export(out)
    assert exp.meta["since"] == 1
    assert [exp.meta["tables"][t]["dropped"] for t in ("e", "f")] == [0, 0]
    for t, ids in changed.items():
        tb = exp.tables[t]
        np.testing.assert_array_equal(tb.ids, np.sort(ids))
        at = np.searchsorted(all_ids[t], tb.ids)
        assert tb.rows.tobytes() == rows[t][at].tobytes()
        assert len(tb.dropped) == 0
    # since the full checkpoint: every row delta-1 or delta-2 touched
    exp0 = ps.load_export(export(cl.path, tmp_path / "d0.npz", "--since", "0") and
                          tmp_path / "d0.npz")
    assert len(exp0.tables["e"]) == 60 + 2
    # a chain shorter than asked for: refused
    r = export(cl.path, tmp_path / "d9.npz", "--since", "9", check=False)
    assert r.returncode == 1 and "only 2 incremental" in r.stderr
    assert not os.path.exists(tmp_path / "d9.npz")


def test_export_torch_embedding_bag(trained, tmp_path):
    torch = pytest.importorskip("torch")
    cl, _, all_ids, rows, _, _ = trained
    out = tmp_path / "model.npz"
    export(cl.path, out, "--quiet")
    lk = ps.export_lookup(ps.load_export(out), "f")
    bag = lk.embedding_bag(mode="sum")
    ids = np.array([all_ids["f"][1], all_ids["f"][2], 77], np.uint64)
    got = bag(torch.from_numpy(lk.index(ids)), torch.tensor([0, 2])).detach().numpy()
    np.testing.assert_allclose(got[0], rows["f"][1] + rows["f"][2], rtol=1e-6)
    assert not got[1].any()


def test_export_refuses_damaged_files(trained, tmp_path):
    cl, _, _, _, _, ck = trained
    full = ck / "shard-1.ckpt"
    good = full.read_bytes()
    out = tmp_path / "x.npz"
    # truncated at many offsets, and single flipped bytes: a clear error, no crash
    step = max(1, len(good) // 97)
    cuts = list(range(0, len(good), step)) + [len(good) - 1, len(good) - 4]
    for cut in cuts:
        full.write_bytes(good[:cut])
        r = export(cl.path, out, check=False)
        assert r.returncode == 1, (cut, r.stderr)
        assert str(full) in r.stderr and ("offset" in r.stderr or "too short" in r.stderr), \
            (cut, r.stderr)
    for at in list(range(0, len(good), step)) + [len(good) - 2]:
        bad = bytearray(good)
        bad[at] ^= 0x5a
        full.write_bytes(bytes(bad))
        r = export(cl.path, out, check=False)
        assert r.returncode == 1, (at, r.stderr)
        assert str(full) in r.stderr and "offset" in r.stderr, (at, r.stderr)
    assert not os.path.exists(out)
    full.write_bytes(good)
    # a damaged incremental checkpoint names itself
    d2 = ck / "shard-0.ckpt.delta-2"
    dgood = d2.read_bytes()
    d2.write_bytes(dgood[:-9])
    r = export(cl.path, out, check=False)
    assert r.returncode == 1 and str(d2) in r.stderr, r.stderr
    d2.write_bytes(dgood)
    export(cl.path, out)
    assert ps.load_export(out).meta["shards"][0]["deltas"] == 2



def crc_fixed(body):
    """body (a checkpoint without its last 4 bytes) with its CRC-32 appended."""
    return body + struct.pack("<I", zlib.crc32(body))


def test_export_header_lies(trained, tmp_path):
    """A full or incremental checkpoint whose header lies, its CRC made right: each
    field is checked on its own, and ps-export refuses the file naming it and saying
    what the header holds against what the config says (struct ckpt_hdr: magic 0,
    endian 8, shard 12, map hash 16, optimizer 24, nstate 28, workers 32, slices 40)."""
    cl, _, _, _, _, ck = trained
    f, d1 = ck / "shard-0.ckpt", ck / "shard-0.ckpt.delta-1"
    good, dgood = f.read_bytes(), d1.read_bytes()
    out = tmp_path / "x.npz"
    nslots = struct.unpack_from("<I", good, 40)[0]
    version = good[7] - ord("0")
    assert good[:7] == b"PSCKPT0" and struct.unpack_from("<iII", good, 12)[0] == 0

    def patched(data, off, raw):
        b = bytearray(data[:-4])
        b[off:off + len(raw)] = raw
        return crc_fixed(bytes(b))

    lies = [
        (f, patched(good, 8, struct.pack("<I", 0x04030201)),
         "written on a machine of the other byte order, or damaged at offset 8"),
        (f, patched(good, 12, struct.pack("<i", 1)),
         "belongs to shard 1 (offset 12), expected shard 0"),
        (f, patched(good, 7, bytes([ord("0") + (((version - 1) | 1) + 1)])),
         f"a version {((version - 1) | 1) + 1} checkpoint (optimizer groups) without "
         "declared tensors (damaged?)"),
        (f, patched(good, 16, bytes(8)), "made with another configuration: shard map "
         "0000000000000000 there, %016x here" % struct.unpack_from("<Q", good, 16)),
        # a hash above every real one: still not the older placement's map (the
        # map a build before re-sharding used is taken for its own hash alone)
        (f, patched(good, 16, b"\xff" * 8), "made with another configuration: shard map "
         "ffffffffffffffff there, %016x here" % struct.unpack_from("<Q", good, 16)),
        (f, patched(good, 24, struct.pack("<I", 1)),
         "made with optimizer momentum, the config says sgd"),
        (f, patched(good, 24, struct.pack("<I", 99)),
         "made with optimizer (damaged), the config says sgd"),
        (f, patched(good, 28, struct.pack("<I", 1)),
         "damaged at offset 28: 1 floats of optimizer state a value, optimizer sgd keeps 0"),
        (f, patched(good, 32, struct.pack("<I", 3)), "made for 3 workers, the config says 1"),
        (f, patched(good, 40, struct.pack("<I", nslots + 1)),
         f"holds {nslots + 1} slices, shard 0 owns {nslots} (damaged?)"),
        (d1, patched(dgood, dgood.index(struct.pack("<II", 0x31544C44, 1)) + 4,
                     struct.pack("<I", 2)),
         f"damaged at offset {dgood.index(struct.pack('<II', 0x31544C44, 1))}: not "
         "incremental checkpoint 1 of the chain"),
    ]
    for what, data, why in lies:
        what.write_bytes(data)
        r = export(cl.path, out, check=False)
        assert r.returncode == 1, (why, r.stderr)
        assert f"ps-export: {what}: " in r.stderr and why in r.stderr, (why, r.stderr)
        what.write_bytes(good if what == f else dgood)
    # a folder in the file's place
    f.unlink()
    f.mkdir()
    r = export(cl.path, out, check=False)
    assert r.returncode == 1 and f"{f}: not a regular file" in r.stderr, r.stderr
    f.rmdir()
    f.write_bytes(good)
    assert not os.path.exists(out)
    export(cl.path, out)


def test_stale_chain_set_aside(trained, tmp_path):
    """A full checkpoint replaced after its chain was written (a crash between the
    new full file and the removal of the old chain): ps-export and the shard agree
    that the chain is history. ps-export warns and exports the full file alone; the
    shard sets delta-1 and the one after it aside (renamed .stale, each with its
    reason) and serves what ps-export exported."""
    cl, dense, all_ids, _, _, ck = trained
    f = ck / "shard-0.ckpt"
    good = f.read_bytes()
    # the last row's last float changed: another full file, its CRC right
    f.write_bytes(crc_fixed(good[:-8] + struct.pack("<f", 0.5)))
    out = tmp_path / "stale.npz"
    r = export(cl.path, out)
    assert (f"ps-export: {f}.delta-1 builds on an older full checkpoint (left by a crash): "
            "not applied, nor any after it") in r.stderr, r.stderr
    exp = ps.load_export(out)
    assert [s["deltas"] for s in exp.meta["shards"]] == [0, 2]
    assert len(exp.tables["e"]) == len(all_ids["e"]) - 1   # not id 5 of delta-2
    for k in range(2):
        cl.start(k)
    log = open(os.path.join(cl.dir, "shard0.log")).read()
    assert (f"{f}.delta-1 builds on the full checkpoint before the present one (a crash "
            f"came before it was removed): not loaded, set aside as {f}.delta-1.stale"
            in log), log
    assert (f"{f}.delta-2 follows an incremental checkpoint that is missing or set aside: "
            f"not loaded, set aside as {f}.delta-2.stale" in log), log
    assert sorted(p.name for p in ck.glob("shard-0.ckpt*")) == [
        "shard-0.ckpt", "shard-0.ckpt.delta-1.stale", "shard-0.ckpt.delta-2.stale"]
    with ps.Client(cl.path, 0) as c:
        got = {n: np.zeros_like(v) for n, v in dense.items()}
        c.pull(got)
        for t, ids in all_ids.items():
            tb = exp.tables[t]   # without the rows delta-2 added on shard 0 (id 5)
            assert 0 < len(tb.ids) <= len(ids) and np.isin(tb.ids, ids).all(), t
            assert c.pull_rows(t, tb.ids).tobytes() == tb.rows.tobytes(), t
    for n, v in got.items():
        assert v.tobytes() == exp.dense[n].tobytes(), n
    assert cl.close() == [0, 0]


def test_export_dropped_rows(cluster, tmp_path):
    """Rows evicted by the cap after the full checkpoint: gone from the full export,
    listed in a --since export's dropped ids."""
    ck = tmp_path / "ck"
    ck.mkdir()
    # max_rows 40 over 2 shards: each keeps at most 20 rows, evicting the oldest
    cl = cluster(shards=2, workers=1, tables={"g": "2, max_rows: 40"},
                 extra=["checkpoint:", f"  dir: {ck}", "  on_request: true",
                        "  min_interval_s: 0", "  incremental: 5"])
    old = np.arange(1, 31, dtype=np.uint64)
    new = np.arange(100, 140, dtype=np.uint64)
    everything = np.concatenate([old, new])
    with ps.Client(cl.path, 0) as c:
        g = {n: np.zeros(k, np.float32) for n, k in cl.tensors.items()}
        c.push_rows("g", old, np.ones((30, 2), np.float32))
        c.push(g)
        assert all(r["checkpoint_status"] == 0 for r in c.checkpoint())      # full
        live0 = old[c.pull_rows("g", old).any(axis=1)]   # rows never pushed pull as zeros
        for i in range(0, 40, 10):   # in steps, so that the cap evicts as they come
            c.push_rows("g", new[i:i + 10], np.full((10, 2), 2, np.float32))
            c.push(g)
        assert all(r["checkpoint_status"] == 0 for r in c.checkpoint())      # delta-1
        pulled = c.pull_rows("g", everything)
    live = everything[pulled.any(axis=1)]
    assert len(live) <= 40 and len(np.setdiff1d(live0, live)) > 0   # some were evicted
    assert [cl.stop(k, signal.SIGKILL) for k in range(2)] == [-signal.SIGKILL] * 2
    export(cl.path, tmp_path / "all.npz")
    t = ps.load_export(tmp_path / "all.npz").tables["g"]
    np.testing.assert_array_equal(t.ids, np.sort(live))
    assert t.rows.tobytes() == pulled[np.searchsorted(everything, t.ids)].tobytes()
    export(cl.path, tmp_path / "d.npz", "--since", "0")
    dx = ps.load_export(tmp_path / "d.npz")
    d = dx.tables["g"]
    np.testing.assert_array_equal(d.ids, np.intersect1d(live, new))
    np.testing.assert_array_equal(d.dropped, np.setdiff1d(np.union1d(live0, new), live))
    assert dx.meta["tables"]["g"]["dropped"] == len(d.dropped) > 0


def test_tombstones_out_of_memory(cluster, tmp_path, monkeypatch):
    """The list of evicted ids an incremental checkpoint needs could not grow (its
    first allocation failed by libpsfault.so): the shard goes on, and the next
    checkpoint is a full one instead of an incremental one that would bring the
    evicted rows back; after it the list is kept again (the next is incremental), and
    a restart from the chain serves exactly what the shard served."""
    if "libasan" in subprocess.run(["ldd", os.path.join(ROOT, "bin", "ps-server")],
                                   capture_output=True, text=True).stdout:
        pytest.skip("bin/ps-server is the sanitizer build: libpsfault.so cannot come first")
    ck, log = tmp_path / "ck", tmp_path / "fault.log"
    ck.mkdir()
    cl = cluster(shards=1, workers=1, tables={"g": "2, max_rows: 20"},
                 extra=["checkpoint:", f"  dir: {ck}", "  on_request: true",
                        "  min_interval_s: 0", "  incremental: 5"])
    # the shard again (killed: no checkpoint at its stop), logging at info,
    # counting allocations from its first checkpoint's line on (the
    # handshake's allocations are not the list's)
    assert cl.stop(0, signal.SIGKILL) == -signal.SIGKILL
    env = dict(os.environ, LD_PRELOAD=FAULT_LIB, PS_FAULT_LOG=str(log),
               PS_FAULT="realloc:1:ENOMEM:=8192",     # 1024 ids: the list's first growth
               PS_FAULT_AFTER="checkpoint (on request): ")
    with open(tmp_path / "shard.log", "wb") as out:
        cl.procs[0] = subprocess.Popen([SERVER, "--config", cl.path, "--shard", "0",
                                        "--log-level", "info"], stderr=out, cwd=ROOT, env=env)
    deadline = time.monotonic() + 10
    while True:   # until it accepts connections
        try:
            socket.create_connection(("127.0.0.1", cl.ports[0]), timeout=1).close()
            break
        except OSError:
            assert time.monotonic() < deadline and cl.procs[0].poll() is None
            time.sleep(0.01)
    ids = np.arange(1, 51, dtype=np.uint64)
    with ps.Client(cl.path, 0) as c:
        g = {n: np.zeros(k, np.float32) for n, k in cl.tensors.items()}
        c.push_rows("g", ids[:20], np.ones((20, 2), np.float32))
        c.push(g)
        assert all(r["checkpoint_status"] == 0 for r in c.checkpoint())      # full
        full0 = (ck / "shard-0.ckpt").read_bytes()
        c.push_rows("g", ids[20:30], np.full((10, 2), 2, np.float32))      # 10 evicted
        c.push(g)
        assert "realloc call 1 (8192 bytes): ENOMEM" in log.read_text(), log.read_text()
        assert all(r["checkpoint_status"] == 0 for r in c.checkpoint())
        assert not (ck / "shard-0.ckpt.delta-1").exists(), "an incremental checkpoint " \
            "without the evicted ids"
        assert (ck / "shard-0.ckpt").read_bytes() != full0   # a full one, with the new rows
        c.push_rows("g", ids[30:40], np.full((10, 2), 3, np.float32))      # 10 more
        c.push(g)
        assert all(r["checkpoint_status"] == 0 for r in c.checkpoint())
        assert (ck / "shard-0.ckpt.delta-1").exists()                        # kept again
        served = c.pull_rows("g", ids[:40])
    assert log.read_text().count("ENOMEM") == 1
    assert (served.any(axis=1)).sum() == 20
    assert cl.stop(0, signal.SIGKILL) == -signal.SIGKILL
    cl.start(0)
    with ps.Client(cl.path, 0) as c:
        assert c.pull_rows("g", ids[:40]).tobytes() == served.tobytes()
    assert cl.close() == [0]


def test_row_cap_clamped(cluster, tmp_path):
    """A table's cap past what a shard's row index can number (max_rows 2^40, a memory
    budget of 1 PiB that would allow more) is clamped to 2^32 - 2 rows, and said so."""
    cl = cluster(shards=1, workers=1, tables={"g": "2, max_rows: 1099511627776"},
                 limits=["  max_table_bytes: 1048576GiB"])
    assert cl.stop(0) == 0
    with open(tmp_path / "cap.log", "wb") as out:
        p = subprocess.Popen([SERVER, "--config", cl.path, "--shard", "0", "--log-level", "info"],
                             stderr=out, cwd=ROOT)
        deadline = time.monotonic() + 10
        while "listening" not in (tmp_path / "cap.log").read_text():
            assert time.monotonic() < deadline and p.poll() is None
            time.sleep(0.01)
        p.send_signal(signal.SIGTERM)
        assert p.wait(timeout=20) == 0
    log = (tmp_path / "cap.log").read_text()
    assert "table g: at most 4294967294 rows on this shard" in log, log


@pytest.mark.parametrize("groups", [False, True])
def test_export_declared_tensors(cluster, tmp_path, groups):
    """A config without a model: the tensors rank 0 declared (with optimizer groups:
    a version 2 checkpoint) come out with their names and shapes, bit for bit."""
    ck = tmp_path / "ck"
    ck.mkdir()
    cl = cluster(shards=2, workers=1, declare=True, tables={"e": 3},
                 extra=["checkpoint:", f"  dir: {ck}", "  on_request: true",
                        "  min_interval_s: 0"])
    rng = np.random.default_rng(3)
    model = {"emb.proj": rng.standard_normal((40, 30)).astype(np.float32),
             "fc.weight": rng.standard_normal((7, 300)).astype(np.float32),
             "fc.bias": rng.standard_normal(7).astype(np.float32)}
    with ps.Client(cl.path, 0) as c:
        if groups:
            c.declare(model, [dict(kind="adam", lr=0.01), dict(kind="sgd", lr=0.1, momentum=0.9)],
                      [0, 1, 1])
        else:
            c.declare(model)
        for _ in range(3):
            c.push({n: rng.standard_normal(v.shape).astype(np.float32) for n, v in model.items()})
        c.push_rows("e", np.array([1, 2], np.uint64), np.ones((2, 3), np.float32))
        c.push({n: np.zeros(v.shape, np.float32) for n, v in model.items()})
        c.pull(model)
        rows = c.pull_rows("e", np.array([1, 2], np.uint64))
        assert all(r["checkpoint_status"] == 0 for r in c.checkpoint())
    assert cl.close() == [0, 0]
    export(cl.path, tmp_path / "m.npz")
    exp = ps.load_export(tmp_path / "m.npz")
    assert list(exp.dense) == list(model)          # declaration order
    for n, v in model.items():
        assert exp.dense[n].shape == v.shape and exp.dense[n].tobytes() == v.tobytes(), n
    assert exp.tables["e"].rows.tobytes() == rows.tobytes()
    assert exp.meta["shards"][0]["checkpoint_version"] == (2 if groups else 1)
    if groups:
        assert [exp.meta["dense"][n]["optimizer"] for n in model] == ["adam", "momentum",
                                                                      "momentum"]
        assert [exp.meta["dense"][n]["group"] for n in model] == [0, 1, 1]
    else:
        assert all("group" not in exp.meta["dense"][n] for n in model)
    # the first declared tensor's record damaged (its checksum left as it was): each
    # refused by the record's own check before the checksum, by ps-export naming the
    # offset and by a shard starting from the file
    f = ck / "shard-0.ckpt"
    good = f.read_bytes()
    at = good.index(b"emb.proj\0")           # name[64], ndims, group, dims[8]
    shape = "declared tensor 'emb.proj' has a damaged shape"
    for patch, off, why, srv_why in (
            (b"\xff\xff\xff\xff", 64, "declared tensor 0 has no name or -1 dimensions",
             "declared tensor 0 is damaged"),
            ((9).to_bytes(4, "little"), 64, "declared tensor 0 has no name or 9 dimensions",
             "declared tensor 0 is damaged"),
            (b"\0", 0, "declared tensor 0 has no name or 2 dimensions",
             "declared tensor 0 is damaged"),
            (bytes(8), 72, shape, shape)):
        bad = bytearray(good)
        bad[at + off:at + off + len(patch)] = patch
        f.write_bytes(bytes(bad))
        r = export(cl.path, tmp_path / "x.npz", check=False)
        assert r.returncode == 1, (why, r.stderr)
        assert f"{f}: damaged at offset {at}: {why}" in r.stderr, (why, r.stderr)
        with pytest.raises(RuntimeError, match="exited 1") as e:
            cl.start(0)
        assert f"{f}: {srv_why}" in str(e.value), (srv_why, str(e.value))
    if groups:
        # the groups' section after the 3 declared tensors (struct ckpt_decl, 136
        # bytes): its count, then a group (struct ckpt_group: kind, nesterov, average,
        # reserved, then lr, ...), each lie told by ps-export and the shard alike
        gpos = at + 3 * 136
        assert struct.unpack_from("<II", good, gpos) == (2, 0)
        assert struct.unpack_from("<I", good, gpos + 8)[0] == 2          # adam
        assert struct.unpack_from("<i", good, at + 68)[0] == 0           # emb.proj's group
        for patch, off, why, srv_why in (
                (struct.pack("<I", 0), gpos, f"damaged at offset {gpos}: 0 optimizer groups, "
                 "expected 1..", "0 optimizer groups: expected 1.."),
                (struct.pack("<I", 99), gpos + 8, f"damaged at offset {gpos + 8}: optimizer "
                 "group 0 of unknown kind 99", "optimizer group 0 is damaged or does not fit "
                 "this config: unknown kind"),
                (struct.pack("<i", 7), at + 68, "declared tensor 'emb.proj' has optimizer "
                 "group 7 of 2 (damaged?)", "declared tensor 'emb.proj' has optimizer group 7 "
                 "of 2 (damaged?)"),
                (struct.pack("<f", -1.0), gpos + 8 + 16, None, "optimizer group 0 is damaged "
                 "or does not fit this config: optimizer group 0: learning rate -1 is not finite and "
                 ">= 0")):
            bad = bytearray(good)
            bad[off:off + len(patch)] = patch
            f.write_bytes(bytes(bad))
            if why:
                r = export(cl.path, tmp_path / "x.npz", check=False)
                assert r.returncode == 1 and f"ps-export: {f}: {why}" in r.stderr, \
                    (why, r.stderr)
            with pytest.raises(RuntimeError, match="exited 1") as e:
                cl.start(0)
            assert f"{f}: {srv_why}" in str(e.value), (srv_why, str(e.value))
    f.write_bytes(good)
    assert not os.path.exists(tmp_path / "x.npz")


DECL_TABLES = [
    {"name": "decl_sgd", "dim": 4, "init": "zeros", "optimizer": "sgd", "lr": 1.0},
    {"name": "decl_adam", "dim": 3, "init": "const", "value": 0.5, "optimizer": "adam",
     "lr": 0.01},
]


@pytest.fixture(params=[3, 4], ids=["v3", "v4"])
def declared_trained(request, cluster, tmp_path):
    """Tables declared at run time (version 3: a config naming its tensors, no YAML
    table; version 4: declared tensors with optimizer groups and a YAML table beside
    the declared ones), trained through push_rows over a full checkpoint and two
    incremental ones, pulled, then the shards killed."""
    v4 = request.param == 4
    ck = tmp_path / "ck"
    ck.mkdir()
    extra = ["checkpoint:", f"  dir: {ck}", "  on_request: true", "  min_interval_s: 0",
             "  incremental: 5"]
    cl = cluster(shards=2, workers=1, declare=v4, tables={"y": 2} if v4 else None,
                 extra=extra)
    rng = np.random.default_rng(11)
    dims = {"decl_sgd": 4, "decl_adam": 3, **({"y": 2} if v4 else {})}
    ids = {"decl_sgd": np.unique(rng.integers(0, 2**64, 200, dtype=np.uint64)),
           "decl_adam": np.arange(1, 80, dtype=np.uint64) * 7919}
    if v4:
        ids["y"] = np.arange(1, 30, dtype=np.uint64)
    with ps.Client(cl.path, 0) as c:
        if v4:
            model = {"fc.weight": np.zeros((5, 40), np.float32), "fc.bias": np.zeros(5, np.float32)}
            c.declare(model, [dict(kind="adam", lr=0.01), dict(kind="sgd", lr=0.1)], [0, 1])
            tensors = {n: v.shape for n, v in model.items()}
        else:
            tensors = {n: (k,) for n, k in cl.tensors.items()}
        c.declare_tables(DECL_TABLES)
        names = list(tensors)
        train_rows(c, rng, names, tensors, ids, dims)
        assert all(r["checkpoint_status"] == 0 for r in c.checkpoint())      # full
        train_rows(c, rng, names, tensors, {"decl_sgd": ids["decl_sgd"][:30]}, dims)
        assert all(r["checkpoint_status"] == 0 for r in c.checkpoint())      # delta-1
        new = np.array([3, 2**63 + 5], np.uint64)
        step = {"decl_sgd": np.concatenate([ids["decl_sgd"][20:50], new]),
                "decl_adam": ids["decl_adam"][::5]}
        train_rows(c, rng, names, tensors, step, dims)
        assert all(r["checkpoint_status"] == 0 for r in c.checkpoint())      # delta-2
        changed = {t: np.unique(v) for t, v in step.items()}
        all_ids = {t: np.union1d(v, new) if t == "decl_sgd" else np.sort(v)
                   for t, v in ids.items()}
        rows = {t: c.pull_rows(t, v) for t, v in all_ids.items()}
        dense = {n: np.zeros(s, np.float32) for n, s in tensors.items()}
        c.pull(dense)
    assert [cl.stop(k, signal.SIGKILL) for k in range(2)] == [-signal.SIGKILL] * 2
    return request.param, cl, dense, all_ids, rows, changed, ck


def decl_section(data):
    """The declared tables' section of a checkpoint: (start, end), found by the first
    declared table's name (the section's head, 8 bytes, is before it)."""
    at = data.index(b"decl_sgd\0")
    start = at - 8
    assert int.from_bytes(data[start:start + 4], "little") == len(DECL_TABLES)
    return start, start + 8 + 136 * len(DECL_TABLES)


def test_export_declared_tables(declared_trained, tmp_path):
    version, cl, dense, all_ids, rows, changed, ck = declared_trained
    assert os.path.exists(ck / "shard-1.ckpt.delta-2")
    out = tmp_path / "model.npz"
    export(cl.path, out)
    exp = ps.load_export(out)
    assert sorted(exp.tables) == sorted(all_ids)
    for t, ids in all_ids.items():
        np.testing.assert_array_equal(exp.tables[t].ids, ids)
        assert exp.tables[t].rows.tobytes() == rows[t].tobytes(), t
    for n, v in dense.items():
        assert exp.dense[n].tobytes() == v.tobytes(), n
    assert [s["checkpoint_version"] for s in exp.meta["shards"]] == [version] * 2
    assert [s["deltas"] for s in exp.meta["shards"]] == [2, 2]
    meta_t = exp.meta["tables"]
    assert list(meta_t) == (["y"] if version == 4 else []) + ["decl_sgd", "decl_adam"]
    assert meta_t["decl_sgd"]["declared"] is True and meta_t["decl_adam"]["optimizer"] == "adam"
    assert meta_t["decl_adam"]["dim"] == 3 and meta_t["decl_sgd"]["rows"] == len(all_ids["decl_sgd"])
    if version == 4:
        assert meta_t["y"]["declared"] is False
    # --since 1: exactly the rows delta-2 changed
    export(cl.path, tmp_path / "d1.npz", "--since", "1")
    d1 = ps.load_export(tmp_path / "d1.npz")
    for t in all_ids:
        tb = d1.tables[t]
        np.testing.assert_array_equal(tb.ids, changed.get(t, np.zeros(0, np.uint64)))
        at = np.searchsorted(all_ids[t], tb.ids)
        assert tb.rows.tobytes() == rows[t][at].tobytes(), t
        assert len(tb.dropped) == 0
    export(cl.path, tmp_path / "d0.npz", "--since", "0")
    assert len(ps.load_export(tmp_path / "d0.npz").tables["decl_sgd"]) == 50 + 2


def test_export_declared_tables_damaged(declared_trained, tmp_path):
    _, cl, _, _, _, _, ck = declared_trained
    out = tmp_path / "x.npz"
    for f in (ck / "shard-1.ckpt", ck / "shard-0.ckpt.delta-1"):
        good = f.read_bytes()
        start, end = decl_section(good)
        for cut in range(start, end, 5):
            f.write_bytes(good[:cut])
            r = export(cl.path, out, check=False)
            assert r.returncode == 1, (f, cut, r.stderr)
            assert str(f) in r.stderr and ("offset" in r.stderr or "too short" in r.stderr), \
                (f, cut, r.stderr)
        for at in range(start, end, 3):
            bad = bytearray(good)
            bad[at] ^= 0x41
            f.write_bytes(bytes(bad))
            r = export(cl.path, out, check=False)
            assert r.returncode == 1, (f, at, r.stderr)
            assert str(f) in r.stderr and "offset" in r.stderr, (f, at, r.stderr)
        # a count beyond the file, and a name without its NUL: named with their offset
        for patch, off in ((b"\xff\x00\x00\x00", start), (b"x" * 64, start + 8)):
            bad = bytearray(good)
            bad[off:off + len(patch)] = patch
            f.write_bytes(bytes(bad))
            r = export(cl.path, out, check=False)
            assert r.returncode == 1 and f"offset {off}" in r.stderr, (f, off, r.stderr)
            if f.name == "shard-1.ckpt" and off == start + 8:
                # and the shard itself refuses the table's record, naming it
                with pytest.raises(RuntimeError, match="exited 1") as e:
                    cl.start(1)
                assert f"{f}: declared table 0 is damaged" in str(e.value), str(e.value)
        f.write_bytes(good)
    assert not os.path.exists(out)
    export(cl.path, out)


def test_chain_drops_declared_tables(declared_trained, tmp_path):
    """An incremental checkpoint whose version drops the declared tables its full
    checkpoint has (its CRC right): ps-export refuses it, naming both versions."""
    version, cl, _, _, _, _, ck = declared_trained
    f = ck / "shard-0.ckpt.delta-1"
    good = f.read_bytes()
    assert good[7] - ord("0") == version and (version - 1) & 2
    bad = bytearray(good[:-4])
    bad[7] = ord("0") + ((version - 1) & ~2) + 1
    f.write_bytes(crc_fixed(bytes(bad)))
    r = export(cl.path, tmp_path / "x.npz", check=False)
    assert r.returncode == 1, r.stderr
    assert (f"ps-export: {f}: a version {((version - 1) & ~2) + 1} checkpoint after a "
            f"version {version} one") in r.stderr, r.stderr
    f.write_bytes(good)


def test_chain_declares_other_tensors(declared_trained):
    """An incremental checkpoint whose declared tensors differ from its full
    checkpoint's in a name or a shape alone (the counts, and so the shard map, the
    same): a shard starting from the chain refuses it, naming the file."""
    version, cl, _, _, _, _, ck = declared_trained
    if version != 4:
        pytest.skip("version 3: the config names the tensors, none are declared")
    f = ck / "shard-0.ckpt.delta-1"
    good = f.read_bytes()
    at = good.index(b"fc.weight\0")           # name[64], ndims, group, dims[8]
    for patch, off in ((b"fc.weighu", 0),      # another name
                       ((40).to_bytes(8, "little") + (5).to_bytes(8, "little"), 72)):
        assert int.from_bytes(good[at + 72:at + 80], "little") == 5
        bad = bytearray(good)
        bad[at + off:at + off + len(patch)] = patch
        f.write_bytes(bytes(bad))
        with pytest.raises(RuntimeError, match="exited 1") as e:
            cl.start(0)
        assert (f"{f}: declares other tensors or optimizer groups than its full checkpoint"
                in str(e.value)), (off, str(e.value))
    f.write_bytes(good)


FAULT_LIB = os.path.join(ROOT, "build", "rel", "tests", "libpsfault.so")


def faulted_export(cfg, out, nth, log, *args):
    """ps-export with its nth allocation failed (tests/fault_inject.c's libpsfault.so);
    returns (the run, whether the fault was made)."""
    if os.path.exists(log):
        os.unlink(log)
    env = dict(os.environ, LD_PRELOAD=FAULT_LIB, PS_FAULT=f"alloc:{nth}", PS_FAULT_LOG=str(log))
    r = subprocess.run([EXPORT, "--config", cfg, "--out", str(out), *args],
                       capture_output=True, text=True, timeout=60, env=env)
    return r, os.path.exists(log) and os.path.getsize(log) > 0


def test_export_out_of_memory(declared_trained, tmp_path):
    """ps-export out of memory at each allocation past the config's parse, in turn, on
    declared tables over a chain of incremental checkpoints, whole and with --since 1:
    every run either writes the same bytes as a run without the fault or exits 1
    saying it ran out of memory, leaving no file; never a signal. (tests/it_export.sh
    sweeps every allocation of a plain export; the config's parse is the same here.)"""
    if not os.path.exists(FAULT_LIB):
        pytest.skip(f"{FAULT_LIB} is not built (make build/rel/tests/libpsfault.so)")
    if b"libasan" in subprocess.run(["ldd", EXPORT], capture_output=True).stdout:
        pytest.skip("bin/ps-export is the sanitizer build: libpsfault.so cannot come first")
    _, cl, _, _, _, _, _ = declared_trained
    log, out = tmp_path / "fault.log", tmp_path / "x.npz"
    # a coverage build: gcov's own write at exit allocates, and crashes when that
    # fails; such a run counts when its export was done and right
    with open(EXPORT, "rb") as f:
        gcov = b"__gcov_" in f.read()
    for args in ((), ("--since", "1")):
        ref = tmp_path / "ref.npz"
        export(cl.path, ref, *args)
        # the allocations a run makes: the last n whose fault is made
        lo, hi = 1, 1 << 16
        assert faulted_export(cl.path, out, lo, log, *args)[1]
        while hi - lo > 1:
            mid = (lo + hi) // 2
            lo, hi = (mid, hi) if faulted_export(cl.path, out, mid, log, *args)[1] else (lo, mid)
        late = in_config = 0
        # from the last allocation down, until 40 refusals in a row name the config
        # (its parse, which comes first)
        for nth in range(lo, 0, -1):
            if out.exists():
                out.unlink()
            r, made = faulted_export(cl.path, out, nth, log, *args)
            assert made, (args, nth)
            if gcov and r.returncode < 0 and "ps-export: wrote" in r.stderr and \
                    out.read_bytes() == ref.read_bytes():
                continue
            assert r.returncode in (0, 1, 2), (args, nth, r.returncode, r.stderr, log.read_text())
            if r.returncode == 0:
                assert out.read_bytes() == ref.read_bytes(), (args, nth, log.read_text())
                continue
            last = r.stderr.strip().splitlines()[-1]
            assert "out of memory" in last or "Cannot allocate memory" in last, \
                (args, nth, r.stderr, log.read_text())
            assert not list(tmp_path.glob("x.npz*")), (args, nth, r.stderr)
            if str(cl.path) in last:
                in_config += 1
                if in_config == 40:
                    break
            else:
                late, in_config = late + 1, 0
        print(f"ps-export {' '.join(args)}: {lo} allocations; {late} refusals past the config")
        assert late >= 20, (args, late)


def test_export_tables_declared_after_the_full_checkpoint(cluster, tmp_path):
    """A full checkpoint before the declaration (version 1), incremental ones after it
    (version 3): the declared tables' rows come from the deltas alone, as a restarted
    shard loads them; --since 0 holds every one of them."""
    ck = tmp_path / "ck"
    ck.mkdir()
    cl = cluster(shards=2, workers=1, tables={"y": 2},
                 extra=["checkpoint:", f"  dir: {ck}", "  on_request: true",
                        "  min_interval_s: 0", "  incremental: 5"])
    rng = np.random.default_rng(4)
    names = list(cl.tensors)
    tensors = {n: (k,) for n, k in cl.tensors.items()}
    dims = {"y": 2, "decl_sgd": 4, "decl_adam": 3}
    ids = np.arange(1, 60, dtype=np.uint64) * 104729
    odd = np.ascontiguousarray(ids[::2])
    with ps.Client(cl.path, 0) as c:
        train_rows(c, rng, names, tensors, {"y": ids[:10]}, dims)
        assert all(r["checkpoint_status"] == 0 for r in c.checkpoint())      # full, v1
        c.declare_tables(DECL_TABLES)
        train_rows(c, rng, names, tensors, {"decl_sgd": ids, "decl_adam": odd}, dims)
        assert all(r["checkpoint_status"] == 0 for r in c.checkpoint())      # delta-1, v3
        train_rows(c, rng, names, tensors, {"decl_sgd": ids[:5]}, dims)
        assert all(r["checkpoint_status"] == 0 for r in c.checkpoint())      # delta-2, v3
        want = {"y": ids[:10], "decl_sgd": ids, "decl_adam": odd}
        rows = {t: c.pull_rows(t, v) for t, v in want.items()}
    assert [cl.stop(k, signal.SIGKILL) for k in range(2)] == [-signal.SIGKILL] * 2
    assert (ck / "shard-0.ckpt").read_bytes()[:8] == b"PSCKPT01"
    assert (ck / "shard-0.ckpt.delta-1").read_bytes()[:8] == b"PSDELTA3"
    export(cl.path, tmp_path / "m.npz")
    exp = ps.load_export(tmp_path / "m.npz")
    for t, v in want.items():
        np.testing.assert_array_equal(exp.tables[t].ids, v)
        assert exp.tables[t].rows.tobytes() == rows[t].tobytes(), t
    assert exp.meta["tables"]["decl_adam"]["declared"] is True
    export(cl.path, tmp_path / "d0.npz", "--since", "0")
    d0 = ps.load_export(tmp_path / "d0.npz")
    assert len(d0.tables["y"]) == 0 and len(d0.tables["decl_sgd"]) == len(ids)
    # a restarted shard agrees: the same rows (a new worker declares the same tables)
    for k in range(2):
        cl.start(k)
    with ps.Client(cl.path, 0) as c:
        c.declare_tables(DECL_TABLES)
        for t, v in want.items():
            assert c.pull_rows(t, v).tobytes() == rows[t].tobytes(), t
