-- The allocated peak of each run (snapshot file and device), largest first:
-- what torch.cuda.max_memory_allocated() said over the recorded trace.
-- A running sum of the blocks' allocated sizes, + at `alloc`, - at
-- `free_requested` (or `free_completed` where none was recorded), in event order, plus what was allocated before the trace
-- began (a ring buffer that wrapped): the bytes the dump holds allocated less
-- where the running sum ends.
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
  SELECT file, rank, device, index,
         sum(CASE WHEN action = 'alloc' THEN CAST(allocated_size AS BIGINT)
                  WHEN action = free_action THEN -CAST(allocated_size AS BIGINT)
                  ELSE 0 END)
           OVER (PARTITION BY file, device ORDER BY index
                 ROWS BETWEEN UNBOUNDED PRECEDING AND CURRENT ROW) AS allocated
  FROM events JOIN frees USING (file, device)
),
runs AS (
  SELECT file, rank, device, max(allocated) AS peak_in_trace,
         max_by(allocated, index) AS at_end
  FROM running
  GROUP BY file, rank, device
),
dumped AS (
  SELECT file, device, sum(CAST(size AS BIGINT)) AS allocated
  FROM blocks
  WHERE state = 'active_allocated'
  GROUP BY file, device
)
SELECT r.file, r.rank, r.device,
       r.peak_in_trace + coalesce(d.allocated, 0) - r.at_end AS peak_allocated_bytes
FROM runs r
LEFT JOIN dumped d ON r.file = d.file AND r.device = d.device
ORDER BY peak_allocated_bytes DESC, r.file, r.device
