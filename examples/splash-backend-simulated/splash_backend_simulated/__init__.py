"""An example SPLASH backend: a simulated device on the CPU.

Its ranks are host processes that talk through gloo, but it answers the hooks a device
backend answers with code of its own: collectives that count what SPLASH asks them to move
(:mod:`.collectives`), an MLA decode kernel written as a device kernel would compute it
(:mod:`.mla`), and a starting hardware profile (``simulated.yaml``) for calibration to
replace. Everything else falls back to the reference backend. See docs/plugins.md.
"""

__version__ = "0.1.0"
