-- Maintenance: due scheduled jobs to READY, expired leases back to READY or DEAD.

-- While READY is busy, maintenance still runs this often
local MAINTENANCE_INTERVAL_MS = 50
