import xgrad_llm


def test_package_exposes_version() -> None:
    assert xgrad_llm.__version__ == "0.1.0"
