#pragma once
// JSON Schema to GBNF: a grammar whose every sentence is compact-ish JSON that validates
// against the schema (a subset of what the schema allows, chosen so that generation ends).
//
// Supported: type (one or a list), const, enum, anyOf, oneOf (as anyOf: its branches must
// exclude each other), allOf of one schema, $ref to #, #/$defs/... and #/definitions/...;
// objects: properties (in the schema's order), required, additionalProperties (a schema with
// no properties makes a map; beside properties no other key is generated); arrays: items,
// minItems, maxItems; strings: minLength, maxLength, format date, time, date-time, uuid,
// email, pattern (a regular-expression subset: literals, classes, ., \d \w \s, groups, |,
// * + ? {m,n}, anchors ^ $ at the ends; no quotes or backslashes matched); numbers and
// integers: minimum, maximum, exclusiveMinimum, exclusiveMaximum (integer bounds exact; a
// bounded number is an integer or has a fraction strictly inside the bounds). Annotations
// (title, description, default, examples, $comment, $schema, $id, ...) are ignored. Any
// other keyword is refused by name.
#include <string>

#include <nlohmann/json.hpp>

namespace osprey::grammar {

// Throws InvalidInput naming the keyword and where in the schema it is ("json_schema:
// /properties/ip: 'format' \"ipv4\" is not supported").
std::string schema_to_gbnf(const nlohmann::ordered_json& schema);

// The generic JSON object grammar of response_format json_object.
std::string json_object_gbnf();

}  // namespace osprey::grammar
