"""Response and request bodies of the REST API (pydantic), apart from the database tables."""
