"""How runs, payloads, times, failures and histories are shown, as text and as JSON: what the
``dex`` command (:mod:`dex.cli`) and the dashboard (:mod:`dex.web`) both print; and how secrets
are not (:mod:`dex.views.secrets`, which the PostgreSQL adapter's errors and ``repr`` use too); a
run's activity steps with their attempts (:mod:`dex.views.attempts`)."""
