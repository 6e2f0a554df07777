"""The project's own tests of its machinery, by layer (not shipped; the shipped suite is properties/):
contract (spec, cos/sin cache, models catalogue), kernels (launch policy, compiles, interpreter),
reference (against independent rules and transformers), backends (the adapters of external code),
harness (plugin, case files, diagnosis, reports, campaigns, mutation runner), suite (the shipped
suite's own ability to fail)."""
