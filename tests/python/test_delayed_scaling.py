"""fp8kit.DelayedScaling from Python: Transformer Engine's update rule (the window's max, NaN/Inf/0 keep the last
scale, no roll without a recorded amax), margin, most_recent, the state's round trip (bytes and pickle), errors."""
import math
import pickle

import numpy as np
import pytest

import fp8kit


def test_the_window_max_gives_the_next_scale():
    d = fp8kit.DelayedScaling("e4m3fn", history_length=4)
    assert d.scale == 1.0 and d.format == "e4m3fn" and d.amax_history.shape == (4,) and not d.calibrated
    d.update(2.0)
    assert d.calibrated and fp8kit.DelayedScaling.from_state(d.state()).calibrated
    assert d.scale == np.float32(448) / np.float32(2.0) and d.scale_inv == np.float32(1) / np.float32(d.scale)
    d.update(1.0)  # the window still holds 2.0
    assert d.scale == 224.0
    for _ in range(3):
        d.update(1.0)  # 2.0 has left the window of four
    assert d.scale == 448.0
    d.update(float("nan"))
    assert d.scale == 448.0  # a NaN window entry is ignored, as fmaxf ignores it
    before = d.amax_history.copy()
    d.update()  # nothing recorded: nothing rolls, the scale stays
    assert np.array_equal(d.amax_history, before, equal_nan=True) and d.scale == 448.0


def test_record_discard_margin_and_most_recent():
    d = fp8kit.DelayedScaling("e5m2", history_length=8, margin=1)
    d.record(3.0)
    d.record(7.0)
    d.discard_step()
    d.record(4.0)
    d.update()
    assert d.scale == np.float32(57344) / np.float32(4.0) / 2
    r = fp8kit.DelayedScaling(algorithm="most_recent", history_length=8)
    r.update(8.0)
    r.update(2.0)
    assert r.scale == 224.0


def test_state_round_trips():
    d = fp8kit.DelayedScaling("e4m3fn", history_length=16, ema_decay=0.5)
    for a in (1.0, 3.0, 2.0):
        d.update(a)
    copies = [pickle.loads(pickle.dumps(d, protocol=p)) for p in range(pickle.HIGHEST_PROTOCOL + 1)]
    for e in [fp8kit.DelayedScaling.from_state(d.state())] + copies:  # (protocols 0 and 1 were a TypeError)
        assert e.scale == d.scale and e.smoothed_amax == d.smoothed_amax
        assert np.array_equal(e.amax_history, d.amax_history)
        e.update(5.0)
        d2 = fp8kit.DelayedScaling.from_state(d.state())
        d2.update(5.0)
        assert e.scale == d2.scale
    with pytest.raises(ValueError):
        fp8kit.DelayedScaling.from_state(b"not a state")


def test_errors():
    with pytest.raises(ValueError, match="history_length"):
        fp8kit.DelayedScaling(history_length=0)
    with pytest.raises(ValueError, match="algorithm"):
        fp8kit.DelayedScaling(algorithm="mean")
    with pytest.raises(ValueError, match="unknown FP8 format"):
        fp8kit.DelayedScaling("e3m4")
    with pytest.raises(ValueError, match="e8m0fnu is MX's scale format"):
        fp8kit.DelayedScaling("e8m0fnu")
    with pytest.raises(ValueError, match="ema_decay"):
        fp8kit.DelayedScaling(ema_decay=1.5)
    with pytest.raises(ValueError, match="history_length must be between 1 and 16777216"):
        fp8kit.DelayedScaling(history_length=2**40)  # a one-line error, not the binding's signature dump
    with pytest.raises(ValueError, match="margin must be between"):
        fp8kit.DelayedScaling(margin=1000)
    with pytest.raises(TypeError, match="history_length must be an int, not float"):
        fp8kit.DelayedScaling(history_length=2.5)
    with pytest.raises(TypeError, match="algorithm must be 'max' or 'most_recent', not int"):
        fp8kit.DelayedScaling(algorithm=3)
    with pytest.raises(TypeError, match="ema_decay must be a number, not str"):
        fp8kit.DelayedScaling(ema_decay="0.5")
    with pytest.raises(ValueError, match=r"ema_decay must be in \[0, 1\) as a float32, got 0.99999999999 \(it rounds to 1\)"):
        fp8kit.DelayedScaling(ema_decay=0.99999999999)
    with pytest.raises(ValueError, match="ema_decay must be a number within float64's range, got an int of 401 digits"):
        fp8kit.DelayedScaling(ema_decay=10**400)
    assert fp8kit.DelayedScaling(ema_decay=np.float32(0.5)).format == "e4m3fn"  # NumPy scalars, as everywhere
    # One-line errors where the binding printed its signatures.
    d = fp8kit.DelayedScaling()
    for call, message in ((lambda: d.record("3"), "amax must be a number, not str"),
                          (lambda: d.update("3"), "amax must be a number, not str"),
                          (lambda: fp8kit.DelayedScaling(format=None), "format must be a format name or dtype, not None"),
                          (lambda: fp8kit.DelayedScaling.from_state("abc"), "state must be bytes"),
                          (lambda: d.record(None), "amax must be a number, not NoneType"),
                          (lambda: fp8kit.DelayedScaling(algorithm=None), "algorithm must be 'max' or 'most_recent', not NoneType"),
                          (lambda: fp8kit.DelayedScaling(history_length=None), "history_length must be an int, not NoneType"),
                          (lambda: fp8kit.DelayedScaling(margin=None), "margin must be an int, not NoneType")):
        with pytest.raises(TypeError, match=message) as e:
            call()
        assert "\n" not in str(e.value)
    d.update(np.float32(2.0))
    assert d.scale == 224.0
    d.update(np.array(4.0))  # one value of an array (a 0-d array, a tensor's .max()) is a number too
    assert d.scale == 112.0
    with pytest.raises(TypeError, match="amax must be a number, not ndarray"):
        d.record(np.array([1.0, 2.0]))
    # An amax past float32's range was recorded as Inf: a step that keeps the previous scale, with nothing said.
    with pytest.raises(ValueError, match=r"amax must be within float32's range \(scales are float32\), got 1e\+300"):
        d.update(1e300)
    assert d.scale == 112.0 and d.amax_history[0] == 0.0  # nothing recorded
    d.record(3.4028235e38)  # float32's largest is one
    assert d.amax_history[0] == np.float32(3.4028235e38)
    d.discard_step()
    d.update(float("inf"))  # Inf itself is a step with Inf, as Transformer Engine takes it: the scale stays
    assert d.scale == 112.0
    # A state whose values no update leaves (here a scale of 0) is refused, not used.
    state = bytearray(fp8kit.DelayedScaling().state())
    state[32:36] = b"\0\0\0\0"
    with pytest.raises(ValueError, match="scale must be finite and positive"):
        fp8kit.DelayedScaling.from_state(bytes(state))
    assert math.isfinite(fp8kit.DelayedScaling().scale)


def test_the_format_as_a_dtype_object():
    import ml_dtypes
    import numpy as np
    for spelling in (ml_dtypes.float8_e5m2, np.dtype(ml_dtypes.float8_e5m2), "float8_e5m2", "e5m2"):
        d = fp8kit.DelayedScaling(spelling, history_length=4)
        d.update(1.0)
        assert d.format == "e5m2" and d.scale == 57344.0, spelling
    with pytest.raises(ValueError, match="unknown FP8 format"):
        fp8kit.DelayedScaling(np.float32)
