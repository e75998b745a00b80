-- What one rank of a job holds that the others do not: for each line of the
-- user's code, the bytes its allocated blocks hold on each rank when the
-- snapshots were taken, and the gap between the heaviest rank and the lightest
-- (a rank with nothing at that line counts 0). Lines are as in top_lines.sql;
-- the files of one job are those with a rank.
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
ranks AS (
  SELECT DISTINCT file, rank FROM blocks WHERE rank IS NOT NULL
),
held AS (
  SELECT b.rank, l.line, sum(CAST(b.size AS BIGINT)) AS bytes
  FROM blocks b
  JOIN lines l ON b.file = l.file AND b.stack_id = l.stack_id
  WHERE b.state = 'active_allocated' AND b.rank IS NOT NULL
  GROUP BY b.rank, l.line
),
every_rank AS (
  SELECT r.rank, x.line, coalesce(h.bytes, 0) AS bytes
  FROM ranks r
  CROSS JOIN (SELECT DISTINCT line FROM held) x
  LEFT JOIN held h ON h.rank = r.rank AND h.line = x.line
)
SELECT line, max(bytes) - min(bytes) AS gap_bytes,
       max_by(rank, bytes) AS heaviest_rank, max(bytes) AS heaviest_bytes,
       min(bytes) AS lightest_bytes
FROM every_rank
GROUP BY line
HAVING max(bytes) > min(bytes)
ORDER BY gap_bytes DESC, line
LIMIT 20
