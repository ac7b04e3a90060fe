"""An error a background thread recorded is raised in the user's thread as a fresh
BytePSError with its message and flags (byteps.common.errors.again)."""
from byteps.common.errors import FLAGS, BytePSError, again


def test_again_keeps_message_and_every_flag():
    src = BytePSError("tensor 'w': local rank(s) [1] of host h0 failed")
    src.brief, src.secondary = True, True
    out = again(src)
    assert out is not src and type(out) is BytePSError and str(out) == str(src)
    assert all(getattr(out, f) is True for f in FLAGS)


def test_again_of_a_plain_error_has_the_flags_off():
    out = again(TimeoutError("late"))
    assert str(out) == "late" and not out.brief and not out.secondary
    assert BytePSError("x").brief is False and BytePSError("x").secondary is False
