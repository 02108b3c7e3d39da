/* utf8.h — strict UTF-8 decoding (RFC 3629): no overlong forms, no surrogates, nothing
 * above U+10FFFF. Shared by the JSON parser (which rejects invalid text) and the
 * tokenizer (which replaces it, as SentencePiece does).
 */
#ifndef FTK_UTF8_H
#define FTK_UTF8_H

#include <stddef.h>
#include <stdint.h>

/* Length (1..4) of the valid sequence at s, n bytes available, with its code point in
 * *cp; 0 when the bytes at s do not start a valid sequence. */
static inline int utf8_decode(const unsigned char *s, size_t n, uint32_t *cp)
{
    if (n == 0)
        return 0;
    unsigned c = s[0];
    if (c < 0x80) {
        *cp = c;
        return 1;
    }
    if (c < 0xC2)
        return 0;
    if (c < 0xE0) {
        if (n < 2 || (s[1] & 0xC0) != 0x80)
            return 0;
        *cp = ((c & 0x1Fu) << 6) | (s[1] & 0x3Fu);
        return 2;
    }
    if (c < 0xF0) {
        if (n < 3 || (s[1] & 0xC0) != 0x80 || (s[2] & 0xC0) != 0x80)
            return 0;
        uint32_t v = ((c & 0x0Fu) << 12) | ((s[1] & 0x3Fu) << 6) | (s[2] & 0x3Fu);
        if (v < 0x800 || (v >= 0xD800 && v <= 0xDFFF))
            return 0;
        *cp = v;
        return 3;
    }
    if (c < 0xF5) {
        if (n < 4 || (s[1] & 0xC0) != 0x80 || (s[2] & 0xC0) != 0x80 || (s[3] & 0xC0) != 0x80)
            return 0;
        uint32_t v = ((c & 0x07u) << 18) | ((s[1] & 0x3Fu) << 12) | ((s[2] & 0x3Fu) << 6) | (s[3] & 0x3Fu);
        if (v < 0x10000 || v > 0x10FFFF)
            return 0;
        *cp = v;
        return 4;
    }
    return 0;
}

/* Writes the UTF-8 form of cp (a valid scalar value) to out; returns its length. */
static inline int utf8_encode(uint32_t cp, char out[4])
{
    if (cp < 0x80) {
        out[0] = (char)cp;
        return 1;
    }
    if (cp < 0x800) {
        out[0] = (char)(0xC0 | (cp >> 6));
        out[1] = (char)(0x80 | (cp & 0x3F));
        return 2;
    }
    if (cp < 0x10000) {
        out[0] = (char)(0xE0 | (cp >> 12));
        out[1] = (char)(0x80 | ((cp >> 6) & 0x3F));
        out[2] = (char)(0x80 | (cp & 0x3F));
        return 3;
    }
    out[0] = (char)(0xF0 | (cp >> 18));
    out[1] = (char)(0x80 | ((cp >> 12) & 0x3F));
    out[2] = (char)(0x80 | ((cp >> 6) & 0x3F));
    out[3] = (char)(0x80 | (cp & 0x3F));
    return 4;
}

/* Offset of the first invalid byte in s[0..n), or n when all of it is valid UTF-8. */
static inline size_t utf8_check(const char *s, size_t n)
{
    const unsigned char *u = (const unsigned char *)s;
    size_t i = 0;
    while (i < n) {
        if (u[i] < 0x80) {
            i++;
            continue;
        }
        uint32_t cp;
        int l = utf8_decode(u + i, n - i, &cp);
        if (!l)
            return i;
        i += (size_t)l;
    }
    return n;
}

#endif
