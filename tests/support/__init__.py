"""Internal fakes shared by shardsim's own tests (``from support.fakes import FakeShardNode``);
helpers useful to users of the test kit are in :mod:`shardsim.testing.helpers` instead."""
