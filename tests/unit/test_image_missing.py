"""What a missing image's error says to do: kernelexec's build command only for the two
images it builds, ``docker pull`` / ``docker build`` for any other (issue 34, item 6)."""

from __future__ import annotations

import pytest

from kernelexec.backends._docker import image_missing_message

pytestmark = pytest.mark.unit


@pytest.mark.parametrize("image", ["kernelexec/python", "kernelexec/python:latest"])
def test_the_default_image_names_kernelexecs_build(image: str) -> None:
    message = image_missing_message(image)
    assert "`kernelexec image build --offline`" in message and "docker pull" not in message


def test_the_launchers_image_names_the_launchers_build() -> None:
    message = image_missing_message("kernelexec/python:launchers")
    assert "`kernelexec image build --offline --with-launchers`" in message


@pytest.mark.parametrize("image", ["myorg/ds:1", "localhost:5000/team/py", "python:3.12-slim"])
def test_a_custom_image_is_pulled_or_built_by_its_owner(image: str) -> None:
    message = image_missing_message(image)
    assert f"`docker pull {image}`" in message and f"`docker build -t {image} .`" in message
    assert "kernelexec image build" not in message
