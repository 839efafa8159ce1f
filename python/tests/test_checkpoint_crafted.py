"""A shard's checkpoint whose structure lies while its CRC-32 is right (what a writer's
bug or a hand edit that fixed the checksum would leave): a random flip is caught by
the checksum, these only by the loader's own checks of the tables' records. Each is
refused at the start, naming the file and what is wrong (the dense part's slices and
finished clocks, the tables' records); the shard serves nothing from it, and the
honest file still loads with every row."""
import os
import signal
import struct
import zlib

import numpy as np
import pytest

import ps

D = 4        # floats a row (sgd: no state)
R = 20       # rows of table e
TABLE = 112  # struct ckpt_table (server/ckpt_format.h)
ROW = 16 + 4 * D  # struct ckpt_row, then the row's floats


def with_crc(body):
    """body (a checkpoint without its last 4 bytes) with its CRC-32 (zlib) appended."""
    return body + struct.pack("<I", zlib.crc32(body))


@pytest.fixture
def checkpointed(cluster, tmp_path):
    """One shard with table e: R rows pushed (row i = -(i + 1) everywhere), a checkpoint
    written, the shard killed (so its stop writes none over it)."""
    ck = tmp_path / "ck"
    ck.mkdir()
    cl = cluster(shards=1, workers=1, tables={"e": D},
                 extra=["checkpoint:", f"  dir: {ck}", "  on_request: true",
                        "  min_interval_s: 0"])
    ids = np.arange(1, R + 1, dtype=np.uint64) * 7919
    with ps.Client(cl.path, 0) as c:
        c.push_rows("e", ids, np.repeat(np.arange(1, R + 1, dtype=np.float32), D).reshape(R, D))
        c.push({n: np.zeros(k, np.float32) for n, k in cl.tensors.items()})
        assert all(r["checkpoint_status"] == 0 for r in c.checkpoint())
    assert cl.stop(0, signal.SIGKILL) == -signal.SIGKILL
    return cl, ck / "shard-0.ckpt", ids


def test_crafted_table_records_refused(checkpointed):
    cl, f, ids = checkpointed
    good = f.read_bytes()
    assert zlib.crc32(good[:-4]) == struct.unpack("<I", good[-4:])[0]
    at = len(good) - 4 - (TABLE + R * ROW)      # the one table's record, the file's last
    dim, row_floats, _version, nrows = struct.unpack_from("<IIQQ", good, at + 8)
    assert (dim, row_floats, nrows) == (D, D, R), (dim, row_floats, nrows)
    assert struct.unpack_from("<Q", good, at + TABLE)[0] in ids

    def patched(off, raw):
        b = bytearray(good[:-4])
        b[off:off + len(raw)] = raw
        return with_crc(bytes(b))

    first, second = at + TABLE, at + TABLE + ROW
    # the dense part: the header (48 bytes: no declared tensors), the first
    # slot's record (slice, reserved, count, version, steps), the one
    # worker's finished clock right before the table
    slice0, count0, version0 = struct.unpack_from("<IxxxxQQ", good, 48)
    assert version0 == 1 and struct.unpack_from("<Q", good, at - 8)[0] == 1
    lies = [
        ("a slice's version ahead of every finished clock",
         patched(48 + 16, struct.pack("<Q", 5)),
         "a slice is at version 5 but no worker finished more than 1 clocks (damaged or "
         "edited?)"),
        ("a slice's version of 2^53", patched(48 + 16, struct.pack("<Q", 1 << 53)),
         f"slice {slice0} has version {1 << 53} and 1 steps, more than any run makes "
         "(damaged?)"),
        ("another slice's id", patched(48, struct.pack("<I", slice0 + 7)),
         f"slice 0 is id {slice0 + 7} of {count0} values, expected id {slice0}"),
        ("a finished clock of 2^53", patched(at - 8, struct.pack("<Q", 1 << 53)),
         f"worker 0 finished clock {1 << 53}, more than any run makes (damaged?)"),
        ("a row more than it holds", patched(at + 24, struct.pack("<Q", R + 1)),
         f"table 'e' claims {R + 1} rows: more than the file holds or the cap allows "
         "(damaged?)"),
        ("another dim", patched(at + 8, struct.pack("<I", D + 1)),
         f"table 0 is not 'e' of dim {D} with 0 floats of state and a filter of 0 slots as "
         "configured"),
        ("bytes after the last table", with_crc(good[:-4] + bytes(8)),
         "8 bytes after the last table (damaged, or made with other tables)"),
        ("a row's id twice", patched(second, good[first:first + 8]),
         f"table 'e': row 1 holds id {struct.unpack_from('<Q', good, first)[0]}, which an "
         "earlier row holds (damaged?)"),
    ]
    for what, data, why in lies:
        f.write_bytes(data)
        with pytest.raises(RuntimeError, match="exited 1") as e:
            cl.start(0)
        assert f"{f}: " in str(e.value) and why in str(e.value), (what, str(e.value))
    # the honest file: every row back
    f.write_bytes(good)
    cl.start(0)
    with ps.Client(cl.path, 0) as c:
        rows = c.pull_rows("e", ids)
    want = -np.repeat(np.arange(1, R + 1, dtype=np.float32), D).reshape(R, D)
    assert rows.tobytes() == want.tobytes()
    assert cl.close() == [0]


def test_crafted_header_refused(checkpointed):
    """Each field of a checkpoint's header (struct ckpt_hdr: magic 0, endian 8, shard 12,
    map hash 16, optimizer 24, floats of state 28, workers 32, consistency 36, slices 40)
    lying on its own, the CRC right, and files that are no checkpoint at all: the shard
    refuses each at the start, naming the file and the field's value against the
    config's, and starts from the honest file."""
    cl, f, ids = checkpointed
    good = f.read_bytes()
    assert good[:8] == b"PSCKPT01"
    nslots = struct.unpack_from("<I", good, 40)[0]

    def patched(off, raw):
        b = bytearray(good[:-4])
        b[off:off + len(raw)] = raw
        return with_crc(bytes(b))

    lies = [
        (patched(0, b"PSCKPT0:"), "not a ps-server checkpoint (bad magic)"),
        (patched(8, struct.pack("<I", 0x04030201)),
         "written on a machine of the other byte order"),
        (patched(7, b"2"), "a version 2 checkpoint (optimizer groups) without declared "
         "tensors (damaged?), or the config names its model"),
        (patched(12, struct.pack("<i", 1)), "belongs to shard 1, this is shard 0"),
        (patched(16, bytes(8)), "made with another configuration: shard map "
         "0000000000000000 there"),
        (patched(24, struct.pack("<I", 1)), "made with optimizer momentum, the config says "
         "sgd"),
        (patched(28, struct.pack("<I", 1)), "damaged at offset 28: 1 floats of optimizer "
         "state a value, optimizer sgd keeps 0"),
        (patched(32, struct.pack("<I", 3)), "made for 3 workers, the config says 1"),
        (patched(36, struct.pack("<I", 1)), "made in async mode, the config says sync"),
        (patched(40, struct.pack("<I", nslots + 1)),
         f"holds {nslots + 1} slices, this shard owns {nslots}"),
        (good[:40], "40 bytes, too short for a checkpoint (truncated?)"),
    ]
    for data, why in lies:
        f.write_bytes(data)
        with pytest.raises(RuntimeError, match="exited 1") as e:
            cl.start(0)
        assert f"{f}: {why}" in str(e.value), (why, str(e.value))
    f.unlink()
    for kind, make in (("a folder", os.mkdir), ("a FIFO", os.mkfifo)):
        make(f)
        with pytest.raises(RuntimeError, match="exited 1") as e:
            cl.start(0)
        assert (f"{f}: not a regular file ({kind}): a checkpoint is read only from a "
                "regular file") in str(e.value), str(e.value)
        (os.rmdir if kind == "a folder" else os.unlink)(f)
    f.write_bytes(good)
    cl.start(0)
    with ps.Client(cl.path, 0) as c:
        assert c.pull_rows("e", ids[:3]).tobytes() == \
            (-np.repeat(np.arange(1, 4, dtype=np.float32), D).reshape(3, D)).tobytes()
    assert cl.close() == [0]
