"""One KB served (`Runtime`, softknn.service.runtime.core), split by concern: core, generation, writes, shared."""
