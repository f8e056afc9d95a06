-- wrk script: POST the file given after `--` (e.g. `wrk ... -s wrk_post.lua URL -- body.json`)
-- as application/json on every request, and print one JSON summary line at the end.
-- No response() function on purpose: with one, wrk copies every response body into
-- Lua, which costs client CPU; statuses are checked by wrk_capture.lua instead.

function init(args)
   local f = assert(io.open(args[1], "rb"))
   wrk.method = "POST"
   wrk.body = f:read("*a")
   f:close()
   wrk.headers["Content-Type"] = "application/json"
end

function done(summary, latency, requests)
   local e = summary.errors
   io.write(string.format(
      'BENCH_JSON {"requests":%d,"duration_us":%d,"bytes":%d,' ..
      '"errors":{"connect":%d,"read":%d,"write":%d,"status":%d,"timeout":%d},' ..
      '"latency_us":{"min":%d,"mean":%.1f,"max":%d,"stdev":%.1f,' ..
      '"p50":%d,"p90":%d,"p99":%d,"p999":%d}}\n',
      summary.requests, summary.duration, summary.bytes,
      e.connect, e.read, e.write, e.status, e.timeout,
      latency.min, latency.mean, latency.max, latency.stdev,
      latency:percentile(50), latency:percentile(90), latency:percentile(99),
      latency:percentile(99.9)))
end
