-- Workflows (lua/README.md section 2.4).

-- 2^50: the due time of a job waiting for others (flow_wait.lua)
local WAIT_DUE_MS = 1125899906842624
