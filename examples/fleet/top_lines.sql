-- The lines of your code that hold the most memory across runs, at the moment
-- each snapshot was taken: bytes of allocated blocks by the innermost frame of
-- the user's own Python code (not a library's, not C++), summed over runs, with
-- the number of runs it appears in and the most it held in one.
WITH user_frames AS (
  SELECT file, stack_id, min(depth) AS depth
  FROM frames
  WHERE filename LIKE '%.py'
    AND filename NOT LIKE '%/site-packages/%'
    AND filename NOT LIKE '%/dist-packages/%'
    AND filename NOT LIKE '%/lib/python3%'
  GROUP BY file, stack_id
),
lines AS (
  SELECT f.file, f.stack_id, concat(f.filename, ':', CAST(f.line AS STRING)) AS line
  FROM frames f
  JOIN user_frames u ON f.file = u.file AND f.stack_id = u.stack_id AND f.depth = u.depth
),
held AS (
  SELECT b.file, l.line, sum(CAST(b.size AS BIGINT)) AS bytes
  FROM blocks b
  JOIN lines l ON b.file = l.file AND b.stack_id = l.stack_id
  WHERE b.state = 'active_allocated'
  GROUP BY b.file, l.line
)
SELECT line, sum(bytes) AS bytes, count(*) AS runs, max(bytes) AS most_in_one_run
FROM held
GROUP BY line
ORDER BY bytes DESC, line
LIMIT 20
