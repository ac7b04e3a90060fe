"""Every role's floor: errors, the validated Config, logging, the scheduler link, metrics.

Used by the scheduler, the servers and the workers alike.  Imports nothing of ours but
:mod:`byteps.transport` (at module level), so that a server or a scheduler never loads the
worker engine (:mod:`byteps.core`).
"""
