// Markdown for replies, built as DOM nodes (never as HTML text, so a reply cannot inject markup):
// fenced code blocks with a copy button, headings, bullet and numbered lists, paragraphs, and
// inline code, bold and italics. A reply that is JSON is shown indented.
"use strict";

const markdown = (() => {
  function copyText(text, button) {
    const done = () => {
      button.textContent = "Copied";
      setTimeout(() => { button.textContent = "Copy"; }, 1500);
    };
    if (navigator.clipboard && window.isSecureContext) {
      navigator.clipboard.writeText(text).then(done, () => fallbackCopy(text) && done());
    } else if (fallbackCopy(text)) {
      done();
    }
  }

  // Pages served over plain HTTP from another host have no clipboard API: a selected textarea.
  function fallbackCopy(text) {
    const area = document.createElement("textarea");
    area.value = text;
    area.style.position = "fixed";
    area.style.opacity = "0";
    document.body.append(area);
    area.select();
    let ok = false;
    try {
      ok = document.execCommand("copy");
    } catch {
      ok = false;
    }
    area.remove();
    return ok;
  }

  function copyButton(text, className = "copy") {
    const button = document.createElement("button");
    button.type = "button";
    button.className = className;
    button.textContent = "Copy";
    button.addEventListener("click", () => copyText(typeof text === "function" ? text() : text,
                                                    button));
    return button;
  }

  function codeBlock(text, language) {
    const wrap = document.createElement("div");
    wrap.className = "code-wrap";
    const pre = document.createElement("pre");
    pre.className = `code ${language || ""}`.trim();
    pre.textContent = text;
    wrap.append(copyButton(text, "copy copy-code"), pre);
    return wrap;
  }

  function asJson(text) {
    const body = text.trim().replace(/^```json\s*\n([\s\S]*?)\n?```$/, "$1");
    if (!/^[[{]/.test(body)) return null;
    try {
      return JSON.parse(body);
    } catch {
      return null;
    }
  }

  // `code`, **bold**, *italic* and _italic_ within a line, as nodes.
  function inline(text) {
    const out = [];
    const pattern = /`([^`\n]+)`|\*\*([^*\n]+)\*\*|\*([^*\n]+)\*|\b_([^_\n]+)_\b/g;
    let last = 0;
    for (const m of text.matchAll(pattern)) {
      if (m.index > last) out.push(document.createTextNode(text.slice(last, m.index)));
      const [tag, body] = m[1] !== undefined ? ["code", m[1]]
        : m[2] !== undefined ? ["strong", m[2]] : ["em", m[3] ?? m[4]];
      const el = document.createElement(tag);
      el.textContent = body;
      out.push(el);
      last = m.index + m[0].length;
    }
    if (last < text.length) out.push(document.createTextNode(text.slice(last)));
    return out;
  }

  function list(lines, ordered) {
    const el = document.createElement(ordered ? "ol" : "ul");
    for (const line of lines) {
      const item = document.createElement("li");
      item.append(...inline(line.replace(ordered ? /^\s*\d+[.)]\s+/ : /^\s*[-*+]\s+/, "")));
      el.append(item);
    }
    return el;
  }

  const BULLET = /^\s*[-*+]\s+/;
  const NUMBERED = /^\s*\d+[.)]\s+/;

  // Text outside code fences: blocks split on blank lines, each a heading, a list or a paragraph.
  function prose(text) {
    const out = [];
    for (const block of text.split(/\n\s*\n/)) {
      const lines = block.split("\n").filter((l) => l.trim() !== "");
      if (!lines.length) continue;
      const heading = lines.length === 1 && lines[0].match(/^(#{1,6})\s+(.*)$/);
      if (heading) {
        const el = document.createElement(`h${Math.min(6, heading[1].length + 2)}`);
        el.append(...inline(heading[2]));
        out.push(el);
      } else if (lines.every((l) => BULLET.test(l))) {
        out.push(list(lines, false));
      } else if (lines.every((l) => NUMBERED.test(l))) {
        out.push(list(lines, true));
      } else {
        const p = document.createElement("p");
        lines.forEach((line, i) => {
          if (i) p.append(document.createElement("br"));
          p.append(...inline(line));
        });
        out.push(p);
      }
    }
    return out;
  }

  function render(el, text) {
    el.replaceChildren();
    const json = asJson(text);
    if (json !== null) {
      el.append(codeBlock(JSON.stringify(json, null, 2), "json"));
      return;
    }
    const pieces = text.replace(/<tool_call>[\s\S]*?(<\/tool_call>|$)/g, "")
      .split(/```(\w*)\n?/);
    for (let i = 0; i < pieces.length; i++) {
      if (i % 2 === 1) continue;                        // a fence's language name
      const inside = i > 0 && (i / 2) % 2 === 1;
      if (inside) el.append(codeBlock(pieces[i].replace(/\n$/, ""), pieces[i - 1]));
      else if (pieces[i].trim()) el.append(...prose(pieces[i]));
    }
  }

  return { render, asJson, codeBlock, copyButton };
})();
