package dex.worker;

import java.math.BigDecimal;
import java.math.BigInteger;
import java.util.ArrayList;
import java.util.Collection;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;

/**
 * A small strict JSON reader and writer (the JDK has none).
 *
 * <p>Reading gives {@code Map<String, Object>} (in order), {@code List<Object>}, {@code String},
 * {@code Long} (or {@code BigInteger} past its range), {@code Double} (or {@code BigDecimal}
 * when a double would lose the number's digits), {@code Boolean} and {@code null}. It refuses what
 * is not strict JSON: NaN, trailing commas, text after the value, more than 512 levels of nesting.
 *
 * <p>Writing takes the same kinds (any {@code Map}, {@code Collection} or array, any
 * {@code Number}, {@code Character}) and refuses the rest, and NaN and the infinities. Every
 * character outside printable ASCII is written as its {@code \\uXXXX} escape, so what a Java
 * string holds crosses exactly, a lone surrogate included (which dex then refuses in a result).
 */
public final class Json {
    private static final int MAX_DEPTH = 512;

    private Json() {}

    /** JSON text that {@link #write} copies as it is (a result encoded once, sent maybe more). */
    record Raw(String text) {}

    /** The value {@code text} holds; {@link IllegalArgumentException} when it is not strict JSON. */
    public static Object parse(String text) {
        Reader reader = new Reader(text);
        reader.space();
        Object value = reader.value(0);
        reader.space();
        if (reader.at < text.length()) {
            throw reader.error("text after the value");
        }
        return value;
    }

    /** {@code value} as JSON text; {@link IllegalArgumentException} for what has no JSON form. */
    public static String write(Object value) {
        StringBuilder out = new StringBuilder();
        write(value, out, 0);
        return out.toString();
    }

    private static void write(Object value, StringBuilder out, int depth) {
        if (depth > MAX_DEPTH) {
            throw new IllegalArgumentException("nested more than " + MAX_DEPTH + " levels deep (a cycle?)");
        }
        if (value == null) {
            out.append("null");
        } else if (value instanceof Raw raw) {
            out.append(raw.text());
        } else if (value instanceof String text) {
            string(text, out);
        } else if (value instanceof Character character) {
            string(character.toString(), out);
        } else if (value instanceof Boolean) {
            out.append(value);
        } else if (value instanceof Double || value instanceof Float) {
            double number = ((Number) value).doubleValue();
            if (Double.isNaN(number) || Double.isInfinite(number)) {
                throw new IllegalArgumentException("JSON has no " + number);
            }
            out.append(value);
        } else if (value instanceof BigDecimal decimal) {
            out.append(decimal.toString());
        } else if (value instanceof Number) { // Integer, Long, BigInteger, Short, Byte
            out.append(value);
        } else if (value instanceof Map<?, ?> map) {
            out.append('{');
            boolean first = true;
            for (Map.Entry<?, ?> entry : map.entrySet()) {
                if (!(entry.getKey() instanceof String key)) {
                    throw new IllegalArgumentException("a JSON object's keys are strings, not " + typeOf(entry.getKey()));
                }
                if (!first) {
                    out.append(',');
                }
                first = false;
                string(key, out);
                out.append(':');
                write(entry.getValue(), out, depth + 1);
            }
            out.append('}');
        } else if (value instanceof Collection<?> items) {
            array(items, out, depth);
        } else if (value instanceof Object[] items) {
            array(List.of(items), out, depth);
        } else {
            throw new IllegalArgumentException("no JSON form for " + typeOf(value));
        }
    }

    private static String typeOf(Object value) {
        return value == null ? "null" : value.getClass().getName();
    }

    private static void array(Collection<?> items, StringBuilder out, int depth) {
        out.append('[');
        boolean first = true;
        for (Object item : items) {
            if (!first) {
                out.append(',');
            }
            first = false;
            write(item, out, depth + 1);
        }
        out.append(']');
    }

    private static void string(String text, StringBuilder out) {
        out.append('"');
        for (int i = 0; i < text.length(); i++) {
            char c = text.charAt(i);
            switch (c) {
                case '"' -> out.append("\\\"");
                case '\\' -> out.append("\\\\");
                case '\n' -> out.append("\\n");
                case '\r' -> out.append("\\r");
                case '\t' -> out.append("\\t");
                default -> {
                    if (c < 0x20 || c >= 0x7f) {
                        out.append(String.format("\\u%04x", (int) c));
                    } else {
                        out.append(c);
                    }
                }
            }
        }
        out.append('"');
    }

    private static final class Reader {
        final String text;
        int at;

        Reader(String text) {
            this.text = text;
        }

        IllegalArgumentException error(String what) {
            return new IllegalArgumentException("not JSON: " + what + " at character " + at);
        }

        void space() {
            while (at < text.length() && " \t\r\n".indexOf(text.charAt(at)) >= 0) {
                at++;
            }
        }

        Object value(int depth) {
            if (depth > MAX_DEPTH) {
                throw error("nested more than " + MAX_DEPTH + " levels deep");
            }
            if (at >= text.length()) {
                throw error("the end of the text where a value was expected");
            }
            char c = text.charAt(at);
            switch (c) {
                case '{':
                    return object(depth);
                case '[':
                    return array(depth);
                case '"':
                    return string();
                case 't':
                    return word("true", Boolean.TRUE);
                case 'f':
                    return word("false", Boolean.FALSE);
                case 'n':
                    return word("null", null);
                default:
                    if (c == '-' || (c >= '0' && c <= '9')) {
                        return number();
                    }
                    throw error("unexpected character " + describe(c));
            }
        }

        private static String describe(char c) {
            return c >= 0x20 && c < 0x7f ? "'" + c + "'" : String.format("U+%04X", (int) c);
        }

        Object word(String word, Object value) {
            if (!text.startsWith(word, at)) {
                throw error("unexpected text");
            }
            at += word.length();
            return value;
        }

        Map<String, Object> object(int depth) {
            Map<String, Object> found = new LinkedHashMap<>();
            at++;
            space();
            if (at < text.length() && text.charAt(at) == '}') {
                at++;
                return found;
            }
            while (true) {
                space();
                if (at >= text.length() || text.charAt(at) != '"') {
                    throw error("a key was expected");
                }
                String key = string();
                space();
                expect(':');
                space();
                found.put(key, value(depth + 1));
                space();
                if (at < text.length() && text.charAt(at) == ',') {
                    at++;
                    continue;
                }
                expect('}');
                return found;
            }
        }

        List<Object> array(int depth) {
            List<Object> found = new ArrayList<>();
            at++;
            space();
            if (at < text.length() && text.charAt(at) == ']') {
                at++;
                return found;
            }
            while (true) {
                space();
                found.add(value(depth + 1));
                space();
                if (at < text.length() && text.charAt(at) == ',') {
                    at++;
                    continue;
                }
                expect(']');
                return found;
            }
        }

        void expect(char c) {
            if (at >= text.length() || text.charAt(at) != c) {
                throw error("'" + c + "' was expected");
            }
            at++;
        }

        String string() {
            at++; // the opening quote
            StringBuilder out = new StringBuilder();
            while (true) {
                if (at >= text.length()) {
                    throw error("an unterminated string");
                }
                char c = text.charAt(at++);
                if (c == '"') {
                    return out.toString();
                }
                if (c < 0x20) {
                    throw error("a control character in a string");
                }
                if (c != '\\') {
                    out.append(c);
                    continue;
                }
                if (at >= text.length()) {
                    throw error("an unterminated escape");
                }
                char escape = text.charAt(at++);
                switch (escape) {
                    case '"' -> out.append('"');
                    case '\\' -> out.append('\\');
                    case '/' -> out.append('/');
                    case 'b' -> out.append('\b');
                    case 'f' -> out.append('\f');
                    case 'n' -> out.append('\n');
                    case 'r' -> out.append('\r');
                    case 't' -> out.append('\t');
                    case 'u' -> {
                        if (at + 4 > text.length()) {
                            throw error("a short \\u escape");
                        }
                        try {
                            out.append((char) Integer.parseInt(text.substring(at, at + 4), 16));
                        } catch (NumberFormatException e) {
                            throw error("a \\u escape that is not hexadecimal");
                        }
                        at += 4;
                    }
                    default -> throw error("an unknown escape");
                }
            }
        }

        Object number() {
            int start = at;
            if (text.charAt(at) == '-') {
                at++;
            }
            int digits = digits();
            if (digits == 0 || (digits > 1 && text.charAt(at - digits) == '0')) {
                throw error("a malformed number");
            }
            boolean integral = true;
            if (at < text.length() && text.charAt(at) == '.') {
                at++;
                integral = false;
                if (digits() == 0) {
                    throw error("a malformed number");
                }
            }
            if (at < text.length() && (text.charAt(at) == 'e' || text.charAt(at) == 'E')) {
                at++;
                integral = false;
                if (at < text.length() && (text.charAt(at) == '+' || text.charAt(at) == '-')) {
                    at++;
                }
                if (digits() == 0) {
                    throw error("a malformed number");
                }
            }
            String literal = text.substring(start, at);
            if (integral) {
                BigInteger big = new BigInteger(literal);
                return big.bitLength() < 64 ? (Object) big.longValue() : big;
            }
            double number = Double.parseDouble(literal);
            if (Double.isInfinite(number)) {
                throw error("a number out of range");
            }
            // a double, unless it would change the number's digits (then exactly, as BigDecimal)
            return new BigDecimal(literal).compareTo(new BigDecimal(Double.toString(number))) == 0
                    ? (Object) number
                    : new BigDecimal(literal);
        }

        int digits() {
            int start = at;
            while (at < text.length() && text.charAt(at) >= '0' && text.charAt(at) <= '9') {
                at++;
            }
            return at - start;
        }
    }
}
