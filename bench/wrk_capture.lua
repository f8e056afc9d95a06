-- wrk script used only after a measured run saw errors: same POST as wrk_post.lua,
-- plus a response() hook that counts every status and writes the first non-200
-- answers (status TAB first 600 bytes of body) to <prefix>.<thread>, where <prefix>
-- is the second script argument. Prints "CAPTURE_STATUS <status> <count>" lines.

local threads = {}
statuses = {}
local samples = 0
local out = nil

function setup(thread)
   table.insert(threads, thread)
   thread:set("thread_id", #threads)
end

function init(args)
   local f = assert(io.open(args[1], "rb"))
   wrk.method = "POST"
   wrk.body = f:read("*a")
   f:close()
   wrk.headers["Content-Type"] = "application/json"
   out = assert(io.open(args[2] .. "." .. tostring(thread_id), "w"))
end

function response(status, headers, body)
   statuses[status] = (statuses[status] or 0) + 1
   if status ~= 200 and samples < 5 then
      samples = samples + 1
      local text = string.gsub(string.sub(body or "", 1, 600), "[\r\n\t]", " ")
      out:write(tostring(status), "\t", text, "\n")
      out:flush()
   end
end

function done(summary, latency, requests)
   local e = summary.errors
   for _, thread in ipairs(threads) do
      for status, count in pairs(thread:get("statuses")) do
         io.write(string.format("CAPTURE_STATUS %d %d\n", status, count))
      end
   end
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
