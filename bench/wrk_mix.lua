-- wrk script for the soak (bench/soak.py): POST a rotating mix of bodies.
-- Argument after `--`: a schedule file, one body file path per line (a path may repeat:
-- that is the mix's weight). Request i of a thread sends line i of the schedule, cycling;
-- thread k starts at line k, so the threads do not send the same body in lockstep.
-- Every distinct body is formatted into a whole HTTP request once, in init(); request()
-- only returns the next one (no per-request string building). No response() hook, for the
-- reason given in wrk_post.lua, whose done() (the BENCH_JSON summary line) is reused here.

local here = debug.getinfo(1, "S").source:match("^@(.*/)") or "./"
dofile(here .. "wrk_post.lua")

local schedule = {}
local position = 1
local threads = 0

function setup(thread)
   threads = threads + 1
   thread:set("thread_number", threads)
end

function init(args)
   local formatted = {}
   for path in io.lines(args[1]) do
      if path ~= "" then
         if formatted[path] == nil then
            local f = assert(io.open(path, "rb"))
            local body = f:read("*a")
            f:close()
            formatted[path] = wrk.format("POST", nil, {["Content-Type"] = "application/json"}, body)
         end
         table.insert(schedule, formatted[path])
      end
   end
   assert(#schedule > 0, "empty schedule " .. args[1])
   position = ((thread_number or 1) - 1) % #schedule + 1
end

function request()
   local r = schedule[position]
   position = position % #schedule + 1
   return r
end
