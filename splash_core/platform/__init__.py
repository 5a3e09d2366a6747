"""The backend contract: hook specifications, the interfaces a backend hands the core
(collectives, streams, kernels), plugin loading and selection, and the typed façade the core
calls backends through."""
