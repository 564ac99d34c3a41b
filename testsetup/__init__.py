"""Sample job trees, shipped as the package ``jobcontrol.testsetup``."""
