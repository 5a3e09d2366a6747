"""Keep Triton's CPU interpreter (``TRITON_INTERPRET=1``, used by CI) working with NumPy 2.4.

Triton 3.6's interpreter turns a scalar into a Python int with ``int(array_of_shape_1)``,
which NumPy 2.4 rejects, so any ``range()`` over a runtime bound fails
(triton-lang/triton#9171, fixed upstream by squeezing first). This applies the same fix
while the interpreter is in use; compiled kernels never go through this code.
"""

from __future__ import annotations


def interpreting() -> bool:
    """Whether Triton kernels run in the interpreter in this process."""
    from triton import knobs

    return bool(knobs.runtime.interpret)


def patch_scalar_index() -> None:
    """Idempotent: make interpreter scalars usable as loop bounds under any NumPy."""
    from triton.runtime import interpreter

    original = interpreter._patch_lang_tensor
    if getattr(original, "splash_scalar_index", False):
        return

    def patched(tensor, scope):
        original(tensor, scope)
        scope.set_attr(tensor, "__index__", lambda self: int(self.handle.data.reshape(-1)[0]))

    patched.splash_scalar_index = True
    interpreter._patch_lang_tensor = patched
