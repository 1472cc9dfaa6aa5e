"""Only the optional compiled relay (nomyo_router/upstream/_pump.c); everything else is in
pyproject.toml. Without a C compiler and Python's headers the install goes on without it,
and the relay stays in Python (nomyo_router/upstream/native.py)."""

from setuptools import Extension, setup

setup(
    ext_modules=[
        Extension(
            "nomyo_router.upstream._pump",
            ["nomyo_router/upstream/_pump.c"],
            extra_compile_args=["-O2", "-Wall"],
            optional=True,
        )
    ]
)
