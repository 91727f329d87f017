"""kiln.Error and kiln.Status against the C library's own table."""
import pytest

import kiln
from kiln import _capi


def test_every_status_is_named_as_kiln_strerror_names_it():
    lib = _capi.lib()
    for s in kiln.Status:
        assert _capi.text(lib.kiln_strerror(s)).startswith(f"KILN_{s.name}:")
    # the enum ends where the C one does: the next value is unknown to both
    unknown = _capi.text(lib.kiln_strerror(len(kiln.Status)))
    assert not unknown.startswith("KILN_ERR_"), unknown


def test_a_failing_call_raises_its_status_name_and_message():
    with pytest.raises(kiln.Error) as ei:
        kiln.format_info("q8_1")
    e = ei.value
    assert e.status == kiln.Status.ERR_NOT_FOUND
    assert e.name == "KILN_ERR_NOT_FOUND"
    assert "q8_1" in e.message
    assert str(e).startswith("KILN_ERR_NOT_FOUND: ")


def test_library_version_matches_the_package():
    assert kiln.library_version() == kiln.__version__
