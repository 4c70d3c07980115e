from askspec.terminal import printable


def test_escape_sequences_become_visible():
    assert printable("a\x1b[2Jb") == "a\\e[2Jb"
    assert printable("bell\x07") == "bell\\x07"
    assert printable("c1\x9b31m") == "c1\\x9b31m"
    assert printable("rtl\u202eevil") == "rtl\\u202eevil"


def test_newlines_kept_unless_single_line():
    assert printable("a\nb\tc") == "a\nb\tc"
    assert printable("a\nb\tc\r", single_line=True) == "a\\nb\\tc\\r"


def test_plain_text_unchanged():
    s = "Ünïcode ✓ \\boxed{3}"
    assert printable(s) == s and printable(s, single_line=True) == s
