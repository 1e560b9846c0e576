// streamfuse dashboard: starts a live session from this browser's camera and microphone
// (MediaRecorder WebM chunks on WS /api/sessions/{id}/media) or watches one (?session=<id>),
// and renders the session's event stream (WS /api/sessions/{id}/events, JSONL-sink records).
"use strict";

(() => {
  const params = new URLSearchParams(location.search);
  const token = params.get("token") || "";
  const $ = (id) => document.getElementById(id);

  // Slide text must survive the encoder for OCR: a high bitrate. Small chunks: the server
  // sees media within 0.05 s of capture, and its speech recognizer gets audio in small steps
  // as from a paced file (fed the demo's audio in 100 or 250 ms chunks it transcribed it with
  // 2.7% WER, in 50 ms chunks with 0%, as from the file).
  const RECORDER = {
    mimeTypes: ["video/webm;codecs=vp8,opus", "video/webm;codecs=vp9,opus", "video/webm"],
    videoBitsPerSecond: 7_000_000,
    audioBitsPerSecond: 128_000,
    timesliceMs: 50,
  };

  const state = {
    sessionId: null,
    mode: "idle", // idle | live | watching | ended | error
    events: 0,
    counts: {},
    ended: false,
    captureOffsetS: null, // media seconds the devices had played before recording started
    audioOffsetS: null,
    videoOffsetS: null,
    recordingStartedAt: null,
    bytesSent: 0,
    chunksSent: 0,
  };
  let stream = null;
  let recorder = null;
  let mediaWs = null;
  let eventsWs = null;
  let textWs = null;
  const notes = new Map(); // LM request id -> {li, answer}

  function withToken(path) {
    const sep = path.includes("?") ? "&" : "?";
    return token ? `${path}${sep}token=${encodeURIComponent(token)}` : path;
  }

  function wsUrl(path) {
    const scheme = location.protocol === "https:" ? "wss:" : "ws:";
    return `${scheme}//${location.host}${withToken(path)}`;
  }

  async function api(method, path, body) {
    const headers = { Accept: "application/json" };
    if (token) headers.Authorization = `Bearer ${token}`;
    if (body !== undefined) headers["Content-Type"] = "application/json";
    const resp = await fetch(path, {
      method, headers, body: body === undefined ? undefined : JSON.stringify(body),
    });
    const data = await resp.json().catch(() => null);
    if (!resp.ok) {
      const detail = data && data.detail ? data.detail : resp.statusText;
      throw new Error(`${method} ${path}: ${resp.status} ${typeof detail === "string" ? detail : JSON.stringify(detail)}`);
    }
    return data;
  }

  function setMode(mode, label) {
    state.mode = mode;
    const el = $("status");
    el.dataset.state = mode;
    el.textContent = label || mode;
    $("start").disabled = mode === "live";
    $("stop").disabled = mode !== "live";
  }

  function showError(message) {
    const list = $("errors");
    const none = list.querySelector(".none");
    if (none) none.remove();
    const li = document.createElement("li");
    li.textContent = message;
    list.append(li);
    li.scrollIntoView({ block: "nearest" });
  }

  function fmtMs(v) {
    return v === undefined || v === null ? "-" : v >= 100 ? v.toFixed(0) : v.toFixed(1);
  }

  function stickToBottom(el, fn) {
    const atBottom = el.scrollHeight - el.scrollTop - el.clientHeight < 24;
    fn();
    if (atBottom) el.scrollTop = el.scrollHeight;
  }

  // ---- rendering, one handler per event type (docs/events.md) ----

  // Committed words, in media order; `asr_revision` events edit them.
  const speech = [];
  const wordKey = (w) => `${w.word}|${w.t_start}|${w.t_end}`;

  function showSpeech(clearPartial = true) {
    const el = $("transcript");
    stickToBottom(el, () => {
      // A word starting with punctuation ("-time", "'s") attaches to the one before.
      let text = "";
      for (const w of speech) {
        const attaches = text && w.word && !/^[\p{L}\p{N}"(\[{]/u.test(w.word);
        text += attaches ? w.word : (text ? " " : "") + w.word;
      }
      $("committed").textContent = text;
      if (clearPartial) $("partial").textContent = "";
    });
  }

  const handlers = {
    ocr(ev) {
      $("screen").textContent = ev.text;
      const [w, h] = ev.resolution || [];
      $("screen-meta").textContent = `${ev.n_lines} lines at ${ev.t_start.toFixed(1)} s, ${fmtMs(ev.latency_ms)} ms`;
      if (w) $("ocr-resolution").textContent = `${w}x${h}`;
    },
    asr(ev) {
      speech.push(...ev.words);
      if (speech.length > 4000) speech.splice(0, speech.length - 4000);
      showSpeech();
    },
    asr_revision(ev) {
      // Speech corrected at an utterance end: the replaced words give way to the new ones.
      const gone = new Set(ev.replaced.map(wordKey));
      const kept = speech.filter((w) => !gone.has(wordKey(w)));
      kept.push(...ev.words);
      kept.sort((a, b) => a.t_start - b.t_start);
      speech.splice(0, speech.length, ...kept);
      showSpeech(false);
    },
    asr_partial(ev) {
      const el = $("transcript");
      stickToBottom(el, () => { $("partial").textContent = ev.text.trim(); });
    },
    lm_token(ev) {
      const note = noteFor(ev);
      note.answer.textContent += ev.text;
    },
    lm(ev) {
      const note = noteFor(ev);
      note.answer.textContent = ev.text;
      note.answer.classList.remove("streaming");
      const bits = [`${ev.n_tokens} tokens`, `${ev.tok_s.toFixed(1)} tok/s`];
      if (ev.ttft_ms !== null && ev.ttft_ms !== undefined) bits.push(`first token ${fmtMs(ev.ttft_ms)} ms`);
      if (ev.interrupted) bits.push("interrupted");
      note.meta.textContent = bits.join(", ");
    },
    text(ev) {
      const list = $("chat");
      stickToBottom(list, () => {
        const li = document.createElement("li");
        const author = document.createElement("span");
        author.className = "author";
        author.textContent = ev.author || ev.kind || "text";
        const body = document.createElement("span");
        body.textContent = ev.text;
        const meta = document.createElement("span");
        meta.className = "meta";
        meta.textContent = ` ${ev.kind} at ${ev.t_start.toFixed(1)} s`;
        li.append(author, body, meta);
        list.append(li);
      });
    },
    error(ev) {
      showError(`${ev.stage}: ${ev.message}${ev.fatal ? " (fatal)" : ""}`);
    },
    gap(ev) {
      showError(`gap ${ev.t_start.toFixed(1)}-${ev.t_end.toFixed(1)} s: ${ev.reason} (${ev.attempts} attempts)`);
    },
    stats(ev) {
      const rows = Object.entries(ev.stages || {});
      const body = $("stages").tBodies[0];
      body.replaceChildren(...rows.map(([name, s]) => {
        const tr = document.createElement("tr");
        for (const v of [name, s.frames, fmtMs(s.latency_ms?.p50), fmtMs(s.latency_ms?.p95), s.queue_depth, s.dropped]) {
          const td = document.createElement("td");
          td.textContent = String(v);
          tr.append(td);
        }
        return tr;
      }));
      $("drops").textContent = String(rows.reduce((n, [, s]) => n + (s.dropped || 0), 0));
      const wall = ev.wall_s || 0;
      $("cpu").textContent = wall > 0 ? `${ev.cpu_s.toFixed(1)} s (${((100 * ev.cpu_s) / wall).toFixed(0)}% of a core)` : `${ev.cpu_s.toFixed(1)} s`;
      if (ev.final) {
        state.ended = true;
        setMode("ended", "ended");
      }
    },
  };

  function noteFor(ev) {
    let note = notes.get(ev.request);
    if (!note) {
      const li = document.createElement("li");
      const prompt = document.createElement("span");
      prompt.className = "prompt";
      prompt.textContent = ev.prompt;
      const answer = document.createElement("span");
      answer.className = "answer streaming";
      const meta = document.createElement("span");
      meta.className = "meta";
      li.append(prompt, answer, document.createTextNode(" "), meta);
      $("notes").append(li);
      note = { li, answer, meta };
      notes.set(ev.request, note);
    }
    return note;
  }

  function onEvent(ev) {
    state.events += 1;
    state.counts[ev.type] = (state.counts[ev.type] || 0) + 1;
    $("event-count").textContent = String(state.events);
    const handle = handlers[ev.type];
    if (handle) {
      try { handle(ev); } catch (e) { console.error("cannot render", ev, e); }
    }
  }

  function resetView() {
    state.events = 0;
    state.counts = {};
    state.ended = false;
    notes.clear();
    for (const id of ["screen", "committed", "partial", "notes", "chat", "screen-meta"]) $(id).replaceChildren();
    $("stages").tBodies[0].replaceChildren();
    $("errors").replaceChildren();
    const none = document.createElement("li");
    none.className = "muted none";
    none.textContent = "none";
    $("errors").append(none);
    for (const [id, v] of [["ocr-resolution", "-"], ["drops", "0"], ["cpu", "-"], ["event-count", "0"]]) $(id).textContent = v;
  }

  // ---- the session's event stream ----

  function watch(id) {
    if (eventsWs) eventsWs.close();
    if (textWs) { textWs.close(); textWs = null; }
    resetView();
    state.sessionId = id;
    $("session-id").textContent = id;
    const url = new URL(location.href);
    url.searchParams.set("session", id);
    history.replaceState(null, "", url);
    const ws = new WebSocket(wsUrl(`/api/sessions/${encodeURIComponent(id)}/events`));
    eventsWs = ws;
    ws.onopen = () => { if (state.mode !== "live") setMode("watching", "watching"); };
    ws.onmessage = (msg) => {
      let ev;
      try { ev = JSON.parse(msg.data); } catch (e) { showError(`bad event message: ${e}`); return; }
      onEvent(ev);
    };
    ws.onclose = (e) => {
      if (eventsWs !== ws) return;
      eventsWs = null;
      if (!state.ended) {
        setMode("error", "disconnected");
        showError(`event stream closed (${e.code}${e.reason ? `: ${e.reason}` : ""})`);
      }
    };
  }

  async function refreshSessions() {
    try {
      const sessions = await api("GET", "/api/sessions");
      const select = $("sessions");
      const keep = select.value;
      select.replaceChildren(new Option("watch a session...", ""));
      for (const s of sessions) {
        select.append(new Option(`${s.id} (${s.status}, ${s.input || "live"})`, s.id));
      }
      select.value = keep;
    } catch (e) {
      showError(String(e.message || e));
    }
  }

  // ---- live capture ----

  async function startLive() {
    setMode("live", "starting");
    try {
      stream = await navigator.mediaDevices.getUserMedia({
        // Full resolution keeps slide text legible; 10 frames/s is plenty for slides and costs
        // a third of the encoding (here) and decoding (on the server) of 30.
        video: { width: { ideal: 1280 }, height: { ideal: 720 }, frameRate: { ideal: 10 } },
        // Speech recognition wants the raw signal, not a call's processed one.
        audio: { echoCancellation: false, noiseSuppression: false, autoGainControl: false },
      });
      $("preview").srcObject = stream;
      $("preview-note").textContent = "sending this camera and microphone";
      const ask = $("ask").value.trim();
      const session = await api("POST", "/api/sessions", { input: null, ask: ask || null, stream_id: "cam" });
      watch(session.id);
      // Recording starts at once: the session loads its models as it is created, and what is
      // sent before they are ready waits in its input rather than being lost.
      setMode("live", "live");
      await openMedia(session.id);
      startRecorder();
    } catch (e) {
      stopTracks();
      setMode("error", "error");
      showError(`cannot start: ${e.message || e}`);
    }
  }

  function openMedia(id) {
    return new Promise((resolve, reject) => {
      const ws = new WebSocket(wsUrl(`/api/sessions/${encodeURIComponent(id)}/media`));
      ws.binaryType = "arraybuffer";
      mediaWs = ws;
      ws.onopen = () => resolve();
      ws.onerror = () => reject(new Error("media socket failed"));
      ws.onclose = (e) => {
        if (mediaWs === ws) mediaWs = null;
        if (state.mode === "live") {
          showError(`media socket closed (${e.code}${e.reason ? `: ${e.reason}` : ""})`);
          stopRecorder(false);
        }
      };
    });
  }

  function startRecorder() {
    const mimeType = RECORDER.mimeTypes.find((t) => MediaRecorder.isTypeSupported(t));
    recorder = new MediaRecorder(stream, {
      mimeType, videoBitsPerSecond: RECORDER.videoBitsPerSecond, audioBitsPerSecond: RECORDER.audioBitsPerSecond,
    });
    recorder.ondataavailable = (e) => {
      // One WebM stream in order: Blobs are sent in the order send() is called.
      if (e.data.size > 0 && mediaWs && mediaWs.readyState === WebSocket.OPEN) {
        mediaWs.send(e.data);
        state.bytesSent += e.data.size;
        state.chunksSent += 1;
      }
    };
    recorder.onstop = () => {
      if (mediaWs && mediaWs.readyState === WebSocket.OPEN) mediaWs.send(JSON.stringify({ type: "end" }));
      stopTracks();
    };
    const video = stream.getVideoTracks()[0];
    const audio = stream.getAudioTracks()[0];
    recorder.onstart = () => {
      state.recordingStartedAt = performance.now();
      // The devices played for a moment before recording began; a fake camera and microphone
      // playing a file need this to line media time up with the file's (the browser
      // benchmark does). Audio is the better clock: its capture is never late, while a
      // starved camera delivers frames behind time.
      const frames = video && video.stats ? video.stats.totalFrames : null;
      const fps = video ? video.getSettings().frameRate : null;
      state.videoOffsetS = frames !== null && fps ? frames / fps : null;
      state.audioOffsetS = audio && audio.stats ? audio.stats.totalFramesDuration / 1000 : null;
      state.captureOffsetS = state.audioOffsetS ?? state.videoOffsetS;
    };
    recorder.start(RECORDER.timesliceMs);
  }

  function stopTracks() {
    if (stream) {
      for (const t of stream.getTracks()) t.stop();
      $("preview-note").textContent = "capture stopped";
    }
    stream = null;
  }

  function stopRecorder(sendEnd = true) {
    if (recorder && recorder.state !== "inactive") {
      if (!sendEnd) recorder.onstop = () => stopTracks();
      recorder.stop(); // its last chunk, then onstop sends {"type": "end"}
    } else {
      stopTracks();
    }
    recorder = null;
    setMode("watching", "finishing");
  }

  // ---- text stream ----

  function sendText(text, author) {
    if (!state.sessionId) { showError("no session to send text to"); return; }
    const message = JSON.stringify({ text, author: author || undefined, kind: "chat" });
    if (textWs && textWs.readyState === WebSocket.OPEN) { textWs.send(message); return; }
    const ws = new WebSocket(wsUrl(`/api/sessions/${encodeURIComponent(state.sessionId)}/text`));
    textWs = ws;
    ws.onopen = () => ws.send(message);
    ws.onclose = (e) => {
      if (textWs === ws) textWs = null;
      if (e.code !== 1000 && e.code !== 1005) showError(`text socket closed (${e.code}${e.reason ? `: ${e.reason}` : ""})`);
    };
  }

  // ---- wiring ----

  $("start").addEventListener("click", startLive);
  $("stop").addEventListener("click", () => stopRecorder(true));
  $("sessions").addEventListener("focus", refreshSessions);
  $("sessions").addEventListener("change", (e) => { if (e.target.value) watch(e.target.value); });
  $("chat-form").addEventListener("submit", (e) => {
    e.preventDefault();
    const input = $("chat-text");
    const text = input.value.trim();
    if (!text) return;
    sendText(text, $("chat-author").value.trim());
    input.value = "";
  });

  // For scripts driving the page (the browser tests and benchmark) and for the console.
  window.streamfuse = { state, start: startLive, stop: () => stopRecorder(true), watch, sendText };

  if (!window.MediaRecorder || !navigator.mediaDevices) {
    $("start").disabled = true;
    $("preview-note").textContent = "this browser cannot capture (needs https or localhost)";
  }
  const session = params.get("session");
  if (session) watch(session);
  refreshSessions();
})();
