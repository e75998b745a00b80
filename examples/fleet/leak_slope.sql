-- Growth of each run (file and device) per training step: the bytes still
-- allocated at the end of each step, fitted by least squares against the step.
-- Steps as memlens finds them (the `step` column); the events before the first
-- step (step 0: model and optimizer set-up) and the last step (the dump may
-- come before it ends) are left out. A leak grows by what each step keeps;
-- a healthy run stays near 0.
WITH frees AS (
  -- A free lowers the allocated bytes at its `free_requested`; a trace
  -- recorded without them (memlens.record's default: skip_actions) has
  -- only the `free_completed`.
  SELECT file, device,
         CASE WHEN max(CASE WHEN action = 'free_requested' THEN 1 ELSE 0 END) = 1
              THEN 'free_requested' ELSE 'free_completed' END AS free_action
  FROM events
  GROUP BY file, device
),
running AS (
  SELECT file, rank, device, step, index,
         sum(CASE WHEN action = 'alloc' THEN CAST(allocated_size AS BIGINT)
                  WHEN action = free_action THEN -CAST(allocated_size AS BIGINT)
                  ELSE 0 END)
           OVER (PARTITION BY file, device ORDER BY index
                 ROWS BETWEEN UNBOUNDED PRECEDING AND CURRENT ROW) AS allocated
  FROM events JOIN frees USING (file, device)
),
step_ends AS (
  SELECT file, rank, device, step, max_by(allocated, index) AS allocated_bytes,
         max(step) OVER (PARTITION BY file, device) AS last_step
  FROM running
  GROUP BY file, rank, device, step
)
SELECT file, rank, device, count(*) AS steps,
       CAST(round(regr_slope(allocated_bytes, step)) AS BIGINT) AS bytes_per_step
FROM step_ends
WHERE step >= 1 AND step < last_step
GROUP BY file, rank, device
ORDER BY bytes_per_step DESC, file, device
