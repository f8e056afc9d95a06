-- wrk script used only after a measured run saw errors: the POST and the BENCH_JSON
-- summary of wrk_post.lua, plus a response() hook that counts every status and writes
-- the first non-200 answers (status TAB first 600 bytes of body) to <prefix>.<thread>,
-- where <prefix> is the second script argument. Prints "CAPTURE_STATUS <status> <count>"
-- lines before the summary.

local here = debug.getinfo(1, "S").source:match("^@(.*/)") or "./"
dofile(here .. "wrk_post.lua")

local post_init = init
local post_done = done
local threads = {}
statuses = {}
local samples = 0
local out = nil

function setup(thread)
   table.insert(threads, thread)
   thread:set("thread_id", #threads)
end

function init(args)
   post_init(args)
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
   for _, thread in ipairs(threads) do
      for status, count in pairs(thread:get("statuses")) do
         io.write(string.format("CAPTURE_STATUS %d %d\n", status, count))
      end
   end
   post_done(summary, latency, requests)
end
