"""How runs, payloads, times, failures and histories are shown, as text and as JSON: what the
``dex`` command (:mod:`dex.cli`) and the dashboard (:mod:`dex.web`) both print."""
