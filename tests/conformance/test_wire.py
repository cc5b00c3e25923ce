"""CONF-14: what crosses between the judge and the kernel's process (``call/wire.py``).  A
message's arrays arrive as memory of the receiver's own, bit for bit, writable; what the
kernel's process sends is read as plain data only, and a message that is not one (a bad
frame, a buffer that never comes) is refused, not waited on forever."""

from __future__ import annotations

import multiprocessing
import pickle
import threading
import time
from typing import Any

import numpy as np
import pytest

from attnspec.conformance.call.wire import receive_message, send_message


def _crossed(message: Any, *, from_kernel: bool = False) -> Any:
    """``message`` sent on one end of a pipe (from a thread: a large one fills the pipe)
    and read on the other."""
    mine, theirs = multiprocessing.Pipe()
    sender = threading.Thread(target=send_message, args=(theirs, message))
    sender.start()
    try:
        return receive_message(mine, time.monotonic() + 60, from_kernel=from_kernel)
    finally:
        sender.join()
        mine.close()
        theirs.close()


@pytest.mark.parametrize("from_kernel", [False, True])
def test_arrays_cross_bit_for_bit_into_memory_of_their_own(from_kernel: bool) -> None:
    """CONF-14: small and large arrays (in the frame, and out of band after it), a
    read-only one and a Fortran-ordered one arrive with the same dtype, shape and bits
    (a NaN's payload and -0.0 too), writable, sharing no memory with what was sent."""
    rng = np.random.default_rng(0)
    large = rng.standard_normal((3, 257, 129)).astype(np.float32)  # > the inline size
    large[0, 0, :2] = [-0.0, np.float32(np.nan)]
    frozen = np.arange(12.0).reshape(3, 4)
    frozen.flags.writeable = False
    sent = {"large": large, "small": np.arange(5), "frozen": frozen, "fortran": large[0].T}
    got = _crossed(("call", sent, 3.5, None), from_kernel=from_kernel)
    assert got[0] == "call" and got[2:] == (3.5, None)
    for name, array in sent.items():
        back = got[1][name]
        assert back.dtype == array.dtype and back.shape == array.shape, name
        assert back.tobytes("A") == array.tobytes("A"), name
        assert back.flags.writeable, name
        assert not np.shares_memory(back, array), name


def test_a_kernel_message_naming_code_is_refused() -> None:
    """CONF-14: a message from the kernel's process that names a function (code the
    judge would run) is refused, as before buffers crossed out of band."""
    with pytest.raises(pickle.UnpicklingError, match="not plain data"):
        _crossed(("returned", print), from_kernel=True)


def test_a_frame_that_is_no_message_is_refused() -> None:
    """CONF-14: bytes that are not a message (the kernel writing on its connection) are
    refused as not plain data, however many buffers they claim."""
    mine, theirs = multiprocessing.Pipe()
    for junk in (b"\xff" * 16 + b"junk", b"\x01" + b"\x00" * 15, b""):
        theirs.send_bytes(junk)
        with pytest.raises(pickle.UnpicklingError):
            receive_message(mine, time.monotonic() + 5, from_kernel=True)
    mine.close()
    theirs.close()


def test_a_buffer_that_never_arrives_is_not_waited_on() -> None:
    """CONF-5: a message whose large buffer is announced but never sent ends at the
    deadline (TimeoutError: the caller stops the kernel's process), and a sender that
    goes away in the middle of one is an EOFError, not a message."""
    mine, theirs = multiprocessing.Pipe()
    bufs: list[pickle.PickleBuffer] = []
    head = pickle.dumps(np.zeros(2**17), protocol=5, buffer_callback=bufs.append)
    frame = (1).to_bytes(8, "little") + len(head).to_bytes(8, "little")
    theirs.send_bytes(frame + bufs[0].raw().nbytes.to_bytes(8, "little") + head)
    with pytest.raises(TimeoutError):
        receive_message(mine, time.monotonic() + 0.2, from_kernel=True)
    theirs.send_bytes(frame + bufs[0].raw().nbytes.to_bytes(8, "little") + head)
    theirs.close()
    with pytest.raises(EOFError):
        receive_message(mine, time.monotonic() + 5, from_kernel=True)
    mine.close()
