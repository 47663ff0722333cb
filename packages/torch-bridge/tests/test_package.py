import xgrad_torch


def test_package_exposes_version() -> None:
    assert xgrad_torch.__version__ == "0.1.0"
